#include "client/connection.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <algorithm>

#include "membroker/ipc/syscall.h"

namespace membroker::detail {

namespace {
// The ErrorReply with request id 0 a broker sends when it refuses the
// connection (out of fds, too many clients) before closing it: its reason.
Status RefusalIn(const ipc::Envelope& env) {
  if (env.request_id != 0 || !std::holds_alternative<ipc::ErrorReply>(env.body)) return Status::Ok();
  Status why = ipc::StatusOf(env.body);
  return Status(why.code(), "the broker refused the connection: " + why.message());
}
}  // namespace

Status Connection::Send(uint64_t rid, uint32_t flags, const ipc::Message& request, Clock::time_point deadline,
                        std::span<const int> fds, bool one_way) {
  std::lock_guard<std::mutex> lk(send_mu_);
  Status why;
  if (unsent_.empty() ? SendFrame(rid, flags, request, deadline, fds, &why)
                      : SendAfterUnsent(rid, flags, request, deadline, fds, &why))
    return Status::Ok();
  if (why.code() != ErrorCode::kTimeout) return why;
  if (one_way) unsent_.emplace_back(rid, request);
  return Status(ErrorCode::kTimeout, std::string("the broker read nothing while ") + ipc::MessageName(request) +
                                         " waited to be sent (stopped or overloaded?); " +
                                         (one_way ? "it goes first with the next message" : "it was not sent"));
}

bool Connection::SendAfterUnsent(uint64_t rid, uint32_t flags, const ipc::Message& request, Clock::time_point deadline,
                                 std::span<const int> fds, Status* why) {
  size_t sent = 0;
  while (sent < unsent_.size() &&
         SendFrame(unsent_[sent].first, ipc::kFlagNoReplyOnSuccess, unsent_[sent].second, deadline, {}, why))
    ++sent;
  const bool all = sent == unsent_.size();
  unsent_.erase(unsent_.begin(), unsent_.begin() + static_cast<std::ptrdiff_t>(sent));
  return all && SendFrame(rid, flags, request, deadline, fds, why);
}

bool Connection::SendFrame(uint64_t rid, uint32_t flags, const ipc::Message& request, Clock::time_point deadline,
                           std::span<const int> fds, Status* why) {
  const std::span<const uint8_t> bytes = encoder_(rid, flags, request);  // (send_mu_ held: none encodes meanwhile)
  for (bool full = true; full;) {
    Status st = ipc::SendFrame(sock_.get(), bytes, fds, &full);  // (full: a slice passed without room)
    if (st.ok()) return true;
    if (full && Clock::now() >= deadline) {
      *why = Status(ErrorCode::kTimeout, "no room until the deadline");
      return false;
    }
    if (!full) {
      *why = st.code() == ErrorCode::kParamInvalid
                 ? std::move(st)
                 : Status(ErrorCode::kNotConnected, "broker connection lost: " + st.message());
      return false;
    }
  }
  return true;
}

Status Connection::AfterFailedSend(std::unique_lock<std::mutex>& lk, Status sent) {
  // What the broker sent before it closed - replies, and a refusal or a
  // hand-over notice saying why - is read now, so the reason is the broker's.
  cv_.wait(lk, [&] { return !reader_active_; });
  DrainLocked();
  if (broken_.ok()) broken_ = sent;
  cv_.notify_all();
  return broken_;
}

void Connection::DrainLocked() {
  for (int i = 0; i < 1024 && broken_.ok(); ++i) {
    pollfd p{sock_.get(), POLLIN, 0};
    if (::poll(&p, 1, 0) != 1 || !(p.revents & POLLIN)) break;
    if (!ipc::RecvFrame(sock_.get(), &frame_).ok()) break;
    Deliver(frame_.bytes, std::move(frame_.fds));
  }
}

bool Connection::Unwait(uint64_t rid) {
  auto it = std::find(waiting_.begin(), waiting_.end(), rid);
  if (it == waiting_.end()) return false;
  *it = waiting_.back();
  waiting_.pop_back();
  return true;
}

Status Connection::NotOurs() const {
  return Status(ErrorCode::kNotConnected, "this connection belongs to the process that connected (pid " +
                                              std::to_string(owner_) +
                                              "); a forked child must connect again");
}

Status Connection::SendOneWay(ipc::Message request) {
  if (CurrentPid() != owner_) return NotOurs();
  std::unique_lock<std::mutex> lk(mu_);
  if (!broken_.ok()) return broken_;
  lk.unlock();
  Status sent = Send(next_rid_++, ipc::kFlagNoReplyOnSuccess, request, Clock::now() + call_timeout_, {}, true);
  if (sent.code() != ErrorCode::kNotConnected) return sent;
  lk.lock();
  return AfterFailedSend(lk, sent);
}

void Connection::Deliver(std::span<const uint8_t> bytes, std::vector<ipc::UniqueFd> fds) {
  auto env = ipc::Decode(bytes);
  if (!env.ok()) {
    broken_ = Status(ErrorCode::kProtocolError, "bad reply from broker: " + env.status().message());
    return;
  }
  uint64_t rid = env->request_id;
  if (Status refused = RefusalIn(*env); !refused.ok()) {
    // NOT_CONNECTED at request id 0: the broker handed over (takeover.cc).
    if (refused.code() == ErrorCode::kNotConnected) moved_generation_ = generation_;
    broken_ = std::move(refused);  // the broker closes it: every call gets the reason
    return;
  }
  if (Unwait(rid)) {
    replies_.emplace_back(rid, Reply{std::move(env->body), std::move(fds)});
    return;
  }
  if (auto it = abandoned_.find(rid); it != abandoned_.end()) {
    // Its caller gave up (TIMEOUT); its fds close with `fds`.
    ReleaseLateGrant(it->second, env->body);
    abandoned_.erase(it);
    return;
  }
  // A reply nobody waits for: the failure of a request sent with SendOneWay().
  ++async_errors_;
  if (std::holds_alternative<ipc::ErrorReply>(env->body))
    last_async_error_ = ipc::StatusOf(env->body);
  else
    last_async_error_ = Status(ErrorCode::kProtocolError, "unexpected reply from broker");
}

void Connection::ReleaseLateGrant(bool engine_import, const ipc::Message& reply) {
  uint64_t handle = 0;
  if (auto* m = std::get_if<ipc::MallocReply>(&reply)) handle = m->handle;
  if (auto* m = std::get_if<ipc::ImportReply>(&reply)) handle = m->handle;
  if (handle == 0) return;
  const auto deadline = Clock::now() + call_timeout_;
  if (engine_import)
    (void)Send(next_rid_++, ipc::kFlagNoReplyOnSuccess, ipc::EngineReleaseRequest{handle}, deadline, {}, true);
  else
    (void)Send(next_rid_++, ipc::kFlagNoReplyOnSuccess, ipc::FreeRequest{handle}, deadline, {}, true);
}

Result<Reply> Connection::Call(ipc::Message request, std::chrono::milliseconds waits_in_broker,
                               std::span<const int> fds) {
  const auto total = call_timeout_ + waits_in_broker;
  const Clock::time_point deadline = Clock::now() + total;
  for (;;) {
    uint64_t moved_at = 0;
    Result<Reply> r = CallOnce(request, deadline, total, fds, &moved_at);
    if (moved_at == 0 || !resend_after_hand_over_) return r;
    // The broker handed over before reading this request (it answers all it
    // read before it says so): send it again once this client has reattached.
    std::unique_lock<std::mutex> lk(mu_);
    if (!cv_.wait_until(lk, deadline, [&] { return generation_ != moved_at; })) return r;
  }
}

Result<Reply> Connection::CallOnce(const ipc::Message& request, Clock::time_point deadline,
                                   std::chrono::milliseconds total, std::span<const int> fds,
                                   uint64_t* moved_at) {
  if (CurrentPid() != owner_) return NotOurs();  // its replies are the parent's to read
  const uint64_t rid = next_rid_++;
  // What a late reply to this call would have to give back goes by the request's type.
  const bool engine_import = std::holds_alternative<ipc::EngineImportRequest>(request);
  const char* name = ipc::MessageName(request);
  std::unique_lock<std::mutex> lk(mu_);
  // Broken by a hand-over: nothing was sent, so wait for the next broker.
  auto moved = [&](Status st) {
    if (moved_generation_ == generation_) *moved_at = generation_;
    return st;
  };
  if (!broken_.ok()) return moved(broken_);
  const uint64_t generation = generation_;
  waiting_.push_back(rid);
  lk.unlock();
  Status sent = Send(rid, 0, request, deadline, fds);
  lk.lock();
  if (!sent.ok()) {
    Unwait(rid);
    if (generation != generation_ || sent.code() != ErrorCode::kNotConnected) return sent;
    return moved(AfterFailedSend(lk, sent));
  }
  for (;;) {
    if (auto it = std::find_if(replies_.begin(), replies_.end(), [rid](const auto& r) { return r.first == rid; });
        it != replies_.end()) {
      Reply r = std::move(it->second);
      replies_.erase(it);
      r.broker = generation;  // (Replace drops the replies of the socket it replaces)
      MB_RETURN_IF_ERROR(ipc::StatusOf(r.body));
      if (r.fds.size() != ipc::ExpectedFds(r.body))
        return Status(ErrorCode::kProtocolError,
                      std::string(ipc::MessageName(r.body)) + " arrived with a wrong fd count");
      return r;
    }
    if (!broken_.ok()) {
      Unwait(rid);
      return moved(broken_);
    }
    if (generation != generation_) {  // sent to a broker that went away meanwhile
      if (moved_generation_ == generation) *moved_at = generation;  // it handed over unread
      return Status(ErrorCode::kNotConnected, std::string(name) + " went to a broker that has gone away");
    }
    const auto now = Clock::now();
    if (now >= deadline) {
      Unwait(rid);
      abandoned_.emplace(rid, engine_import);
      return Status(ErrorCode::kTimeout,
                    std::string("the broker did not answer ") + name + " within " +
                        std::to_string(total.count()) +
                        " ms (stopped or overloaded?)");
    }
    if (reader_active_) {
      cv_.wait_until(lk, deadline);
      continue;
    }
    reader_active_ = true;
    lk.unlock();
    Status st;
    int poll_errno = 0;
    const int ready = ReadFrame(deadline, &frame_, &st, &poll_errno);
    lk.lock();
    reader_active_ = false;
    if (ready > 0) {
      if (st.ok())
        Deliver(frame_.bytes, std::move(frame_.fds));
      else
        broken_ = Status(ErrorCode::kNotConnected, "broker connection lost: " + st.message());
    } else if (ready < 0 && poll_errno != EINTR) {
      broken_ = ipc::ErrnoStatus("poll", "broker socket", poll_errno);
    }
    cv_.notify_all();
  }
}

bool Connection::SetSlices(int sock) {
  timeval slice{0, static_cast<suseconds_t>(kSlice.count() * 1000)};
  return ::setsockopt(sock, SOL_SOCKET, SO_RCVTIMEO, &slice, sizeof(slice)) == 0 &&
         ::setsockopt(sock, SOL_SOCKET, SO_SNDTIMEO, &slice, sizeof(slice)) == 0;
}

int Connection::ReadFrame(Clock::time_point deadline, ipc::Frame* frame, Status* st, int* poll_errno) {
  for (;;) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return 0;
    if (sliced_ && left > kSlice) {
      bool would_block = false;
      *st = ipc::RecvFrame(sock_.get(), frame, &would_block);
      if (!would_block) return 1;
      continue;  // a slice passed without a frame
    }
    // Read only once the socket has a frame, so the wait ends at the deadline.
    pollfd p{sock_.get(), POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(std::min<long long>(left.count(), 1 << 30)));
    *poll_errno = errno;
    if (ready <= 0) return ready;
    *st = ipc::RecvFrame(sock_.get(), frame);
    return 1;
  }
}

Status Connection::BreakOnHangup(Status otherwise) {
  std::unique_lock<std::mutex> lk(mu_);
  return AfterFailedSend(lk, std::move(otherwise));
}

uint64_t Connection::generation() const {
  std::lock_guard<std::mutex> lk(mu_);
  return generation_;
}

bool Connection::attached() const {
  std::lock_guard<std::mutex> lk(mu_);
  return broken_.ok();
}

void Connection::Replace(ipc::UniqueFd sock) {
  std::lock_guard<std::mutex> send_lk(send_mu_);
  std::unique_lock<std::mutex> lk(mu_);
  cv_.wait(lk, [&] { return !reader_active_; });
  sock_ = std::move(sock);
  sliced_ = SetSlices(sock_.get());
  unsent_.clear();  // the old broker's: the new one holds what the client presents
  broken_ = Status::Ok();
  ++generation_;
  waiting_.clear();
  abandoned_.clear();  // late replies of the old broker cannot come any more
  replies_.clear();
  cv_.notify_all();
}

uint64_t Connection::async_errors() const {
  std::lock_guard<std::mutex> lk(mu_);
  return async_errors_;
}

Status Connection::last_async_error() const {
  std::lock_guard<std::mutex> lk(mu_);
  return last_async_error_;
}

}  // namespace membroker::detail
