#include "connection.h"

namespace membroker::detail {

Status Connection::Send(uint64_t rid, uint32_t flags, ipc::Message request) {
  std::vector<uint8_t> bytes = ipc::Encode({ipc::kProtocolVersion, rid, flags, std::move(request)});
  std::lock_guard<std::mutex> lk(send_mu_);
  Status st = ipc::SendFrame(sock_.get(), bytes, {});
  if (!st.ok() && st.code() != ErrorCode::kParamInvalid)
    return Status(ErrorCode::kNotConnected, "broker connection lost: " + st.message());
  return st;
}

Status Connection::Notify(ipc::Message request) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!broken_.ok()) return broken_;
  }
  return Send(next_rid_++, ipc::kFlagNoReplyOnSuccess, std::move(request));
}

void Connection::Deliver(ipc::Frame frame) {
  auto env = ipc::Decode(frame.bytes);
  if (!env.ok()) {
    broken_ = Status(ErrorCode::kProtocolError, "bad reply from broker: " + env.status().message());
    return;
  }
  uint64_t rid = env->request_id;
  if (waiting_.erase(rid) == 1) {
    replies_.emplace(rid, Reply{std::move(env->body), std::move(frame.fds)});
    return;
  }
  // A reply nobody waits for: the failure of a request sent with Notify().
  ++async_errors_;
  if (std::holds_alternative<ipc::ErrorReply>(env->body))
    last_async_error_ = ipc::StatusOf(env->body);
  else
    last_async_error_ = Status(ErrorCode::kProtocolError, "unexpected reply from broker");
}

Result<Reply> Connection::Call(ipc::Message request) {
  const uint64_t rid = next_rid_++;
  std::unique_lock<std::mutex> lk(mu_);
  if (!broken_.ok()) return broken_;
  waiting_.insert(rid);
  lk.unlock();
  Status sent = Send(rid, 0, std::move(request));
  lk.lock();
  if (!sent.ok()) {
    waiting_.erase(rid);
    return sent;
  }
  for (;;) {
    if (auto it = replies_.find(rid); it != replies_.end()) {
      Reply r = std::move(it->second);
      replies_.erase(it);
      MB_RETURN_IF_ERROR(ipc::StatusOf(r.body));
      if (r.fds.size() != ipc::ExpectedFds(r.body))
        return Status(ErrorCode::kProtocolError,
                      std::string(ipc::MessageName(r.body)) + " arrived with a wrong fd count");
      return r;
    }
    if (!broken_.ok()) {
      waiting_.erase(rid);
      return broken_;
    }
    if (reader_active_) {
      cv_.wait(lk);
      continue;
    }
    reader_active_ = true;
    lk.unlock();
    ipc::Frame frame;
    Status st = ipc::RecvFrame(sock_.get(), &frame);
    lk.lock();
    reader_active_ = false;
    if (st.ok())
      Deliver(std::move(frame));
    else
      broken_ = Status(ErrorCode::kNotConnected, "broker connection lost: " + st.message());
    cv_.notify_all();
  }
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
