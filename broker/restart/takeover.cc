// Take-over's sockets and deadlines (takeover.h).
#include "restart/takeover.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/pidfd.h"
#include "membroker/ipc/syscall.h"
#include "server/socket_path.h"
#include "uv_status.h"

namespace membroker::broker {

namespace {
constexpr int kStepMs = 10000;     // each frame, and the acknowledgement
constexpr int kReceiveMs = 30000;  // the new broker waits this long for the next frame

// Only the broker's own uid (or root) may take it over.
bool SameOwner(int fd) {
  auto cred = ipc::GetPeerCred(fd);
  return cred.ok() && (cred->uid == ::geteuid() || cred->uid == 0);
}
}  // namespace

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

// ---- the old broker ----------------------------------------------------------

Status TakeOver::Init() {
  MB_RETURN_IF_ERROR(UvStatus("uv_timer_init", uv_timer_init(loop_, &timer_)));
  timer_.data = this;
  return Status::Ok();
}

Status TakeOver::Listen(const std::string& path) {
  MB_RETURN_IF_ERROR(BindSeqpacket(path, 0177, &listen_fd_, &bound_));  // mode 0600
  const int raw = listen_fd_.get();
  MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("listen", path, nullptr, [&] { return ::listen(raw, 1); }));
  MB_RETURN_IF_ERROR(UvStatus("uv_poll_init", uv_poll_init(loop_, &poll_, raw)));
  poll_.data = this;
  return UvStatus("uv_poll_start", uv_poll_start(&poll_, UV_READABLE, [](uv_poll_t* h, int status, int) {
                    if (status >= 0) static_cast<TakeOver*>(h->data)->Accept();
                  }));
}

void TakeOver::Accept() {
  ipc::UniqueFd conn(::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
  if (!conn.valid()) return;
  if (conn_.valid() || closed_) return;  // one at a time; `conn` closes
  if (!SameOwner(conn.get())) {
    MB_WARN("takeover_refused", "reason=\"not this broker's uid\"");
    return;
  }
  auto hello = ReceiveWithin(conn.get(), 2000, nullptr);
  if (!hello.ok() || !std::holds_alternative<ipc::TakeOverHello>(hello->body)) {
    MB_WARN("takeover_refused", "reason=\"no TakeOverHello\"");
    return;
  }
  new_pid_ = std::get<ipc::TakeOverHello>(hello->body).pid;
  conn_ = std::move(conn);
  deadline_ = uv_now(loop_) + kDrainMs;
  on_request_();
  if (!conn_.valid()) return;  // refused at once
  if (Status st = UvStatus("uv_timer_start",
                           uv_timer_start(&timer_, [](uv_timer_t* t) { static_cast<TakeOver*>(t->data)->on_tick_(); },
                                          0, 1));
      !st.ok()) {
    MB_WARN("takeover_failed", "reason=\"%s\" (serving on)", LogText(st.message()).c_str());
    Abort();
  }
}

Status TakeOver::Send(ipc::Message m, std::span<const int> fds) {
  uv_timer_stop(&timer_);  // drained: the rest is sent without turning the loop
  return SendWithin(conn_.get(), std::move(m), fds, kStepMs);
}

Status TakeOver::AwaitAck() {
  auto ack = ReceiveWithin(conn_.get(), kStepMs, nullptr);
  if (!ack.ok()) return ack.status();
  if (!std::holds_alternative<ipc::TakeOverAck>(ack->body))
    return Status(ErrorCode::kProtocolError, "the new broker did not acknowledge");
  return Status::Ok();
}

void TakeOver::Abort() {
  conn_.reset();
  uv_timer_stop(&timer_);
}

void TakeOver::Close(const std::string& path) {
  if (closed_) return;
  closed_ = true;
  uv_close(reinterpret_cast<uv_handle_t*>(&timer_), nullptr);
  if (bound_) {
    uv_close(reinterpret_cast<uv_handle_t*>(&poll_), nullptr);
    ::unlink(path.c_str());
    bound_ = false;
  }
}

// ---- the new broker ------------------------------------------------------------

Result<TakeOverReceiver> TakeOverReceiver::Connect(const std::string& path) {
  auto conn = ipc::ConnectSeqpacket(path);
  if (!conn.ok())
    return Status(ErrorCode::kNotConnected,
                  "--take-over: no broker to take over at " + path + ": " + conn.status().message());
  if (!SameOwner(conn->get()))
    return Status(ErrorCode::kPermissionDenied, "--take-over: " + path + " belongs to another uid");
  TakeOverReceiver r;
  r.conn_ = std::move(*conn);
  // The old broker's exit is awaited on its pidfd: its other sockets are
  // closed only by then (the take-over connection may close first).
  if (auto cred = ipc::GetPeerCred(r.conn_.get()); cred.ok())
    if (auto pidfd = ipc::PidfdOpenIfSupported(cred->pid); pidfd.ok()) r.old_broker_ = std::move(*pidfd);
  MB_RETURN_IF_ERROR(SendWithin(r.conn_.get(), ipc::TakeOverHello{static_cast<int32_t>(::getpid())}, {}, kStepMs));
  return r;
}

Result<ipc::Envelope> TakeOverReceiver::Next(std::vector<ipc::UniqueFd>* fds) {
  auto env = ReceiveWithin(conn_.get(), kReceiveMs, fds);
  if (!env.ok()) return Status(env.code(), "--take-over: " + env.status().message());
  return env;
}

Status TakeOverReceiver::Finish() {
  MB_RETURN_IF_ERROR(SendWithin(conn_.get(), ipc::TakeOverAck{}, {}, kStepMs));
  // The old broker exits now; its admin and take-over sockets are ours after.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kStepMs);
  for (;;) {
    pollfd p{old_broker_.valid() ? old_broker_.get() : conn_.get(), POLLIN, 0};
    if (::poll(&p, 1, Remaining(deadline)) <= 0)
      return Status(ErrorCode::kTimeout, "--take-over: the old broker did not exit");
    if (old_broker_.valid()) return Status::Ok();  // its pidfd turned readable: it has exited
    char b[64];
    if (::recv(conn_.get(), b, sizeof(b), 0) <= 0) return Status::Ok();
  }
}

}  // namespace membroker::broker
