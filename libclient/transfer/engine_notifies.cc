// Notifies: short named messages between engines, sent over the connection's
// transport; those of this host queue at the broker, those of other hosts in
// the network transport, and both wake the client's wake fd.

#include <poll.h>

#include <cerrno>

#include "transfer/engine_impl.h"
#include "membroker/ipc/escape.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/syscall.h"

namespace membroker {

using namespace engine_detail;  // the helpers the Impl files share

Status TransferEngine::Impl::SendNotify(const std::string& remote, const NotifyDesc& notify, int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  std::shared_ptr<Connection> c = Find(remote);
  if (c == nullptr) return NotConnected(remote);
  if (notify.name.size() > ipc::kMaxNotifyNameBytes || notify.notify_msg.size() > ipc::kMaxNotifyMessageBytes)
    return Status(ErrorCode::kParamInvalid, "notify name is at most 128 bytes, its message at most 1024");
  if (!ipc::IsValidUtf8(notify.name)) return Status(ErrorCode::kParamInvalid, "a notify name must be valid UTF-8");
  return c->transport->SendNotify(c->id, notify.name, notify.notify_msg, DeadlineAfter(timeout_ms));
}

Status TransferEngine::Impl::GetNotifies(std::vector<Notify>& notifies) {
  if (!initialized_) return NotInitialized();
  notifies.clear();
  std::vector<detail::ReceivedNotify> got;
  {
    std::lock_guard<std::mutex> lk(net_mu_);
    if (net_) (void)net_->TakeNotifies(&got);  // (never fails)
  }
  ReportNetwork();
  // Those from other hosts, taken above, are returned even when the broker
  // (which queues this host's) cannot be asked: never dropped.
  const size_t from_other_hosts = got.size();
  Status st = same_host_->TakeNotifies(&got);
  for (auto& n : got) notifies.push_back(Notify{std::move(n.from), std::move(n.name), std::move(n.message)});
  return st.ok() || from_other_hosts > 0 ? Status::Ok() : st;
}

Status TransferEngine::Impl::WaitNotifies(std::vector<Notify>& notifies, int32_t timeout_ms) {
  if (!initialized_) return NotInitialized();
  if (timeout_ms < 0 || timeout_ms > 600'000) return Status(ErrorCode::kParamInvalid, "timeout_ms must be 0 to 600000");
  MB_ASSIGN_OR_RETURN(const int fd, core_->WakeFd());
  const auto deadline = DeadlineAfter(timeout_ms);
  for (;;) {
    core_->wake().Drain();  // before taking: a notify queued after the take wakes the poll below
    MB_RETURN_IF_ERROR(GetNotifies(notifies));
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (!notifies.empty() || left <= 0) return Status::Ok();
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, static_cast<int>(left)) < 0 && errno != EINTR)
      return ipc::ErrnoStatus("poll", "the wake fd", errno);
  }
}

}  // namespace membroker
