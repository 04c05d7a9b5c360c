// Take-over: a planned upgrade with nothing lost (docs/RESTART.md).
//
// The running broker listens on SOCKET.takeover (mode 0600; its own uid or
// root only). A new broker started with --take-over connects there; the old
// one then
//  1. stops accepting (new connections wait in the listening socket's
//     backlog) and stops reading its clients,
//  2. lets what is in flight finish (allocations being created on workers;
//     at most 5 s) and sends every queued reply,
//  3. sends the listening socket, every allocation with its fd, every export
//     and every name, and waits for the new broker's acknowledgement,
//  4. tells each client to reattach (an ErrorReply with request id 0 and
//     NOT_CONNECTED: every request it read was answered, so the client sends
//     again what got no answer) and exits 0 without releasing anything.
// If the new broker fails before acknowledging, the old one serves on as if
// nothing had happened. The new broker keeps memory and names nobody has
// reattached to for --reattach-grace-ms, then releases them.
#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "broker.h"
#include "log.h"
#include "membroker/ipc/memfd.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/syscall.h"
#include "uv_status.h"

namespace membroker::broker {

namespace {
constexpr int kDrainMs = 5000;     // in-flight work may take this long to finish
constexpr int kStepMs = 10000;     // each frame, and the acknowledgement
constexpr int kReceiveMs = 30000;  // the new broker waits this long for the next frame

int Remaining(std::chrono::steady_clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
  return left.count() < 0 ? 0 : static_cast<int>(left.count());
}

Status SendWithin(int fd, ipc::Message m, std::span<const int> fds, int timeout_ms) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  const std::vector<uint8_t> bytes = ipc::Encode({ipc::kProtocolVersion, 0, 0, std::move(m)});
  for (;;) {
    bool would_block = false;
    Status st = ipc::SendFrame(fd, bytes, fds, &would_block);
    if (!would_block) return st;
    pollfd p{fd, POLLOUT, 0};
    if (::poll(&p, 1, Remaining(deadline)) <= 0)
      return Status(ErrorCode::kTimeout, "the other broker did not read within " + std::to_string(timeout_ms) + " ms");
  }
}

Result<ipc::Envelope> ReceiveWithin(int fd, int timeout_ms, std::vector<ipc::UniqueFd>* fds) {
  pollfd p{fd, POLLIN, 0};
  int n = ::poll(&p, 1, timeout_ms);
  if (n == 0) return Status(ErrorCode::kTimeout, "the other broker sent nothing for " + std::to_string(timeout_ms) + " ms");
  if (n < 0) return ipc::ErrnoStatus("poll", "the take-over socket", errno);
  ipc::Frame frame;
  MB_RETURN_IF_ERROR(ipc::RecvFrame(fd, &frame));
  MB_ASSIGN_OR_RETURN(ipc::Envelope env, ipc::Decode(frame.bytes));
  if (frame.fds.size() != ipc::ExpectedFds(env.body))
    return Status(ErrorCode::kProtocolError, std::string(ipc::MessageName(env.body)) + " came with a wrong fd count");
  if (fds != nullptr) *fds = std::move(frame.fds);
  return env;
}

// Only the broker's own uid (or root) may take it over.
bool SameOwner(int fd) {
  auto cred = ipc::GetPeerCred(fd);
  return cred.ok() && (cred->uid == ::geteuid() || cred->uid == 0);
}
}  // namespace

// ---- the old broker ----------------------------------------------------------

Status Broker::ListenTakeOver() {
  const std::string path = TakeOverSocketPath();
  MB_RETURN_IF_ERROR(BindSeqpacket(path, 0177, &takeover_listen_fd_, &takeover_bound_));  // mode 0600
  const int raw = takeover_listen_fd_.get();
  MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("listen", path, nullptr, [&] { return ::listen(raw, 1); }));
  MB_RETURN_IF_ERROR(UvStatus("uv_poll_init", uv_poll_init(&loop_, &takeover_poll_, raw)));
  takeover_poll_.data = this;
  return UvStatus("uv_poll_start", uv_poll_start(&takeover_poll_, UV_READABLE, &Broker::OnTakeOverReadable));
}

void Broker::OnTakeOverReadable(uv_poll_t* h, int status, int) {
  if (status < 0) return;
  static_cast<Broker*>(h->data)->BeginHandOver();
}

void Broker::BeginHandOver() {
  ipc::UniqueFd conn(::accept4(takeover_listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!conn.valid()) return;
  if (handover_conn_.valid() || stopping_) return;  // one at a time; `conn` closes
  if (!SameOwner(conn.get())) {
    MB_WARN("takeover_refused", "reason=\"not this broker's uid\"");
    return;
  }
  auto hello = ReceiveWithin(conn.get(), 2000, nullptr);
  if (!hello.ok() || !std::holds_alternative<ipc::TakeOverHello>(hello->body)) {
    MB_WARN("takeover_refused", "reason=\"no TakeOverHello\"");
    return;
  }
  handover_pid_ = std::get<ipc::TakeOverHello>(hello->body).pid;
  handover_conn_ = std::move(conn);
  MB_INFO("takeover_begins", "new_pid=%d clients=%zu allocations=%zu", static_cast<int>(handover_pid_),
          sessions_.size(), table_.all().size());
  // 1. Nothing new comes in: connections wait in the backlog, requests in
  //    their sockets, for the new broker.
  uv_poll_stop(&listen_poll_);
  for (auto& [id, s] : sessions_)
    if (!s->closing) uv_poll_stop(&s->poll);
  handover_deadline_ = uv_now(&loop_) + kDrainMs;
  if (Status st = UvStatus("uv_timer_start", uv_timer_start(
                                                 &handover_timer_,
                                                 [](uv_timer_t* t) { static_cast<Broker*>(t->data)->ContinueHandOver(); },
                                                 0, 1));
      !st.ok())
    ResumeServing(st.message());
}

void Broker::ContinueHandOver() {
  // 2. What is in flight finishes first (its reply is sent before the notice).
  bool busy = counters_.bytes_pending > 0;
  for (auto& [id, s] : sessions_) busy = busy || s->inflight > 0;
  if (busy && uv_now(&loop_) < handover_deadline_) return;
  uv_timer_stop(&handover_timer_);
  std::vector<uint64_t> ids;
  for (auto& [id, s] : sessions_) ids.push_back(id);
  const auto flush_deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kDrainMs);
  for (uint64_t id : ids) {
    Session* s = FindSession(id);
    while (s != nullptr && !s->closing && !s->outbound.empty()) {
      Flush(*s);
      s = FindSession(id);
      if (s == nullptr || s->closing || s->outbound.empty()) break;
      pollfd p{s->fd.get(), POLLOUT, 0};
      if (::poll(&p, 1, Remaining(flush_deadline)) <= 0) break;  // it does not read: it loses those replies
    }
    if (s != nullptr && !s->closing) uv_poll_stop(&s->poll);  // Flush re-armed it
  }
  // 3. The state, then the new broker's word that it has it all.
  Status st = SendState(handover_conn_.get());
  if (st.ok()) {
    auto ack = ReceiveWithin(handover_conn_.get(), kStepMs, nullptr);
    if (!ack.ok()) st = ack.status();
    else if (!std::holds_alternative<ipc::TakeOverAck>(ack->body))
      st = Status(ErrorCode::kProtocolError, "the new broker did not acknowledge");
  }
  if (!st.ok()) {
    ResumeServing(st.message());
    return;
  }
  // 4. Every client reattaches to the new broker; this one exits holding
  //    everything until the kernel closes its fds (the new broker has its own).
  const std::vector<uint8_t> notice = ipc::Encode(
      {ipc::kProtocolVersion, 0, 0,
       ipc::ErrorReply{ErrorCode::kNotConnected,
                       "membrokerd handed over to a new broker (pid " + std::to_string(handover_pid_) +
                           "); reattaching"}});
  for (auto& [id, s] : sessions_) {
    if (s->closing) continue;
    (void)ipc::SendFrame(s->fd.get(), notice, {});
    // No more requests can come (the client's sends fail now), and those
    // that came unread are dropped here: a socket closed with unread data
    // would reset the client's end before it reads the notice.
    ::shutdown(s->fd.get(), SHUT_RD);
    ipc::Frame unread;
    while (ipc::RecvFrame(s->fd.get(), &unread).ok() && !unread.bytes.empty()) {
    }
  }
  MB_INFO("handed_over", "new_pid=%d clients=%zu allocations=%zu exports=%zu names=%zu",
          static_cast<int>(handover_pid_), sessions_.size(), table_.all().size(), table_.export_count(),
          names_.size());
  std::fflush(stderr);
  ::_exit(0);
}

Status Broker::SendState(int fd) {
  const int listen = listen_fd_.get();
  MB_RETURN_IF_ERROR(SendWithin(fd, ipc::TakeOverSockets{}, {&listen, 1}, kStepMs));
  ipc::TakeOverAllocations batch;
  std::vector<int> fds;
  auto send_batch = [&]() -> Status {
    if (batch.handles.empty()) return Status::Ok();
    Status st = SendWithin(fd, std::move(batch), fds, kStepMs);
    batch = {};
    fds.clear();
    return st;
  };
  for (const auto& [id, a] : table_.all()) {
    batch.handles.push_back({a.id, a.page_size, a.policy, a.pinned, a.fell_back, a.fixed_address,
                             static_cast<uint32_t>(a.creator_uid)});
    fds.push_back(a.memory.fd.get());
    if (batch.handles.size() == ipc::kMaxReattachHandles) MB_RETURN_IF_ERROR(send_batch());
  }
  MB_RETURN_IF_ERROR(send_batch());
  std::vector<ipc::Message> records = StateRecords();
  for (ipc::Message& m : records) {
    if (auto* end = std::get_if<ipc::TakeOverEnd>(&m)) end->allocations = table_.all().size();
    MB_RETURN_IF_ERROR(SendWithin(fd, std::move(m), {}, kStepMs));
  }
  return Status::Ok();
}

std::vector<ipc::Message> Broker::StateRecords() const {
  std::vector<ipc::Message> out;
  for (const auto& [token, e] : table_.exports())
    out.push_back(ipc::TakeOverExport{token, e.allocation, static_cast<uint32_t>(e.exporter_uid), e.flags, e.allowed});
  for (const auto& [name, e] : names_) {
    const uint32_t flags = (e.read_only ? ipc::kPublishReadOnly : 0) | (e.persist ? ipc::kPublishPersist : 0);
    out.push_back(
        ipc::TakeOverName{name, e.allocation, flags, static_cast<uint32_t>(e.uid), e.publisher_pid, e.metadata});
  }
  out.push_back(ipc::TakeOverEnd{0, table_.export_count(), names_.size()});
  return out;
}

void Broker::ResumeServing(const std::string& why) {
  MB_WARN("takeover_failed", "reason=\"%s\" (serving on)", LogText(why).c_str());
  handover_conn_.reset();
  uv_timer_stop(&handover_timer_);
  if (!listening_paused_) (void)uv_poll_start(&listen_poll_, UV_READABLE, &Broker::OnListenReadable);
  for (auto& [id, s] : sessions_)
    if (!s->closing)
      (void)uv_poll_start(&s->poll, UV_READABLE | UV_DISCONNECT | (s->polling_writable ? UV_WRITABLE : 0),
                          &Broker::OnSessionEvent);
}

// ---- the new broker ------------------------------------------------------------

Status Broker::ReceiveTakeOver() {
  const std::string path = TakeOverSocketPath();
  auto conn = ipc::ConnectSeqpacket(path);
  if (!conn.ok())
    return Status(ErrorCode::kNotConnected, "--take-over: no broker to take over at " + path + ": " +
                                                conn.status().message());
  if (!SameOwner(conn->get()))
    return Status(ErrorCode::kPermissionDenied, "--take-over: " + path + " belongs to another uid");
  const int fd = conn->get();
  // The old broker's exit is awaited on its pidfd: its other sockets are
  // closed only by then (the take-over connection may close first).
  ipc::UniqueFd old_broker;
  if (auto cred = ipc::GetPeerCred(fd); cred.ok())
    if (auto pidfd = ipc::PidfdOpenIfSupported(cred->pid); pidfd.ok()) old_broker = std::move(*pidfd);
  MB_RETURN_IF_ERROR(SendWithin(fd, ipc::TakeOverHello{static_cast<int32_t>(::getpid())}, {}, kStepMs));
  uint64_t allocations = 0, exports = 0, names = 0;
  for (;;) {
    std::vector<ipc::UniqueFd> fds;
    auto env = ReceiveWithin(fd, kReceiveMs, &fds);
    if (!env.ok()) return Status(env.code(), "--take-over: " + env.status().message());
    if (std::holds_alternative<ipc::TakeOverSockets>(env->body)) {
      listen_fd_ = std::move(fds[0]);
      (void)::fcntl(listen_fd_.get(), F_SETFL, ::fcntl(listen_fd_.get(), F_GETFL) | O_NONBLOCK);
    } else if (auto* m = std::get_if<ipc::TakeOverAllocations>(&env->body)) {
      for (size_t i = 0; i < m->handles.size(); ++i) {
        auto adopted = AdoptHandedOver(m->handles[i], std::move(fds[i]));
        if (!adopted.ok()) return Status(adopted.code(), "--take-over: " + adopted.status().message());
        StoreMemory(**adopted);
        ++allocations;
      }
    } else if (auto* m = std::get_if<ipc::TakeOverExport>(&env->body)) {
      MB_RETURN_IF_ERROR(table_.RestoreExport(m->token, m->allocation, 0, m->exporter_uid, m->flags, m->pids));
      ++exports;
    } else if (auto* m = std::get_if<ipc::TakeOverName>(&env->body)) {
      if (Status st = RestoreName(*m); !st.ok()) return Status(st.code(), "--take-over: " + st.message());
      ++names;
    } else if (auto* m = std::get_if<ipc::TakeOverEnd>(&env->body)) {
      if (m->allocations != allocations || m->exports != exports || m->names != names || !listen_fd_.valid())
        return Status(ErrorCode::kProtocolError, "--take-over: the state arrived incomplete");
      break;
    } else {
      return Status(ErrorCode::kProtocolError,
                    std::string("--take-over: unexpected ") + ipc::MessageName(env->body));
    }
  }
  MB_RETURN_IF_ERROR(SendWithin(fd, ipc::TakeOverAck{}, {}, kStepMs));
  // The old broker exits now; its admin and take-over sockets are ours after.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStepMs);
  for (;;) {
    pollfd p{old_broker.valid() ? old_broker.get() : fd, POLLIN, 0};
    if (::poll(&p, 1, Remaining(deadline)) <= 0)
      return Status(ErrorCode::kTimeout, "--take-over: the old broker did not exit");
    if (old_broker.valid()) break;  // its pidfd turned readable: it has exited
    char b[64];
    if (::recv(fd, b, sizeof(b), 0) <= 0) break;
  }
  socket_bound_ = true;  // the socket path is this broker's to remove now
  MB_INFO("took_over", "allocations=%llu exports=%llu names=%llu grace_ms=%u",
          static_cast<unsigned long long>(allocations), static_cast<unsigned long long>(exports),
          static_cast<unsigned long long>(names), options_.reattach_grace_ms);
  MB_RETURN_IF_ERROR(UvStatus("uv_poll_init", uv_poll_init(&loop_, &listen_poll_, listen_fd_.get())));
  listen_poll_.data = this;
  MB_RETURN_IF_ERROR(UvStatus("uv_poll_start", uv_poll_start(&listen_poll_, UV_READABLE, &Broker::OnListenReadable)));
  return StartReattachGrace();
}

Result<Allocation*> Broker::AdoptHandedOver(const ipc::TakeOverAllocation& x, ipc::UniqueFd fd) {
  struct stat st{};
  if (::fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 || table_.Find(x.id) != nullptr)
    return Status(ErrorCode::kProtocolError, "allocation " + std::to_string(x.id) + " is unusable");
  ipc::PhysicalMemory mem;
  mem.fd = std::move(fd);
  mem.size = static_cast<uint64_t>(st.st_size);
  mem.page_size = x.page_size;
  mem.fell_back = x.fell_back;
  MB_ASSIGN_OR_RETURN(Allocation * a,
                      AdoptMemory(x.id, std::move(mem), x.policy, x.creator_uid, x.pinned, x.fixed_address,
                                  {static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino)}));
  a->holders = 0;  // its holders come back by reattaching
  a->awaiting = true;
  return a;
}

Status Broker::RestoreName(const ipc::TakeOverName& m) {
  const Allocation* a = table_.Find(m.allocation);
  if (a == nullptr) return Status(ErrorCode::kProtocolError, "a name of an unknown allocation");
  if (names_.count(m.name)) return Status(ErrorCode::kAlreadyExists, "the name \"" + m.name + "\" came twice");
  MB_RETURN_IF_ERROR(ipc::CheckName(m.name, ipc::kMaxObjectNameBytes, "a name"));
  NamedEntry e;
  e.name = m.name;
  e.allocation = m.allocation;
  e.publisher_pid = m.publisher_pid;
  e.uid = m.uid;
  e.read_only = m.flags & ipc::kPublishReadOnly;
  e.persist = m.flags & ipc::kPublishPersist;
  e.awaiting_publisher = !e.persist;
  e.metadata = m.metadata;
  if (e.read_only) {
    MB_ASSIGN_OR_RETURN(e.read_only_fd, backend_.ReadOnlyFd(a->memory));
  }
  table_.AddHolder(m.allocation);
  names_.emplace(m.name, std::move(e));
  return Status::Ok();
}

Status Broker::StartReattachGrace() {
  return UvStatus("uv_timer_start", uv_timer_start(
                                        &grace_timer_,
                                        [](uv_timer_t* t) { static_cast<Broker*>(t->data)->ExpireAwaiting(); },
                                        options_.reattach_grace_ms, 0));
}

void Broker::ExpireAwaiting() {
  size_t released = 0, unpublished = 0;
  for (auto it = names_.begin(); it != names_.end();) {
    auto next = std::next(it);
    if (it->second.awaiting_publisher) {
      Unpublish(it, 0);
      ++unpublished;
    }
    it = next;
  }
  std::vector<uint64_t> unheld;
  for (auto& [id, a] : table_.all())
    if (a.awaiting && a.holders == 0) unheld.push_back(id);
  for (uint64_t id : unheld)
    if (auto gone = table_.RemoveUnheld(id)) {
      Retire(std::move(*gone));
      ++released;
    }
  for (const auto& [id, a] : table_.all())
    if (Allocation* live = table_.Find(id)) live->awaiting = false;
  MB_INFO("reattach_grace_over", "released=%zu unpublished=%zu", released, unpublished);
}

}  // namespace membroker::broker
