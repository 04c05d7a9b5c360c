// Admission (admission.h).
#include "server/admission.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "log.h"
#include "membroker/ipc/framing.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/syscall.h"
#include "server/socket_path.h"
#include "uv_status.h"

namespace membroker::broker {

namespace {
constexpr int kListenBacklog = 512;
constexpr uint64_t kListenRetryMs = 100;  // listener paused without a reserve fd
}  // namespace

uint64_t FdLimit() {
  rlimit rl{};
  return ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? static_cast<uint64_t>(rl.rlim_cur) : 0;
}

Status OutOfFds(int err) {
  return Status(ErrorCode::kResourceExhausted,
                std::string("the broker is out of file descriptors (") +
                    (err == ENFILE ? "the system's table is full" : "limit " + std::to_string(FdLimit())) +
                    "); connection refused, try again later");
}

Status Admission::Init() {
  for (uv_timer_t* t : {&retry_timer_, &handshake_timer_}) {
    MB_RETURN_IF_ERROR(UvStatus("uv_timer_init", uv_timer_init(loop_, t)));
    t->data = this;
  }
  // Kept for the moment the broker runs out of fds: closing it makes room to
  // accept a connection and refuse it with a reason.
  reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!reserve_fd_) return ipc::ErrnoStatus("open", "/dev/null (the reserve fd)", errno);
  return Status::Ok();
}

Status Admission::Listen(const Options& options, ipc::UniqueFd activated) {
  // Started by systemd with the socket already listening (membrokerd.socket):
  // serve that one. It is systemd's to create and remove, and connections
  // queued while the broker (re)started are waiting in it.
  if (activated.valid()) {
    listen_fd_ = std::move(activated);
    const int fd = listen_fd_.get();
    MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("fcntl", "O_NONBLOCK on the activated socket", nullptr, [&] {
      return ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    }));
    (void)::fcntl(fd, F_SETFD, FD_CLOEXEC);
    MB_INFO("socket_activated", "fd=%d", fd);
    return StartPolling();
  }
  // Clients of the same uid or group may connect: mode 0660.
  MB_RETURN_IF_ERROR(BindSeqpacket(options.socket_path, 0117, &listen_fd_, &bound_));
  if (!options.socket_group.empty()) {
    Result<gid_t> group = ResolveGroup(options.socket_group);
    if (!group.ok()) return Status(group.code(), "--socket-group: " + group.status().message());
    const gid_t gid = *group;
    MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("chown", options.socket_path, nullptr, [&] {
      return ::chown(options.socket_path.c_str(), static_cast<uid_t>(-1), gid);
    }));
  }
  MB_RETURN_IF_ERROR(ipc::CheckedCall<int>("listen", options.socket_path, nullptr,
                                           [&] { return ::listen(listen_fd_.get(), kListenBacklog); }));
  return StartPolling();
}

Status Admission::Adopt(ipc::UniqueFd listening) {
  listen_fd_ = std::move(listening);
  (void)::fcntl(listen_fd_.get(), F_SETFL, ::fcntl(listen_fd_.get(), F_GETFL) | O_NONBLOCK);
  bound_ = true;  // the socket path is this broker's to remove now
  return StartPolling();
}

Status Admission::StartPolling() {
  MB_RETURN_IF_ERROR(UvStatus("uv_poll_init", uv_poll_init(loop_, &poll_, listen_fd_.get())));
  polling_ = true;
  poll_.data = this;
  return UvStatus("uv_poll_start", uv_poll_start(&poll_, UV_READABLE, &Admission::OnReadable));
}

void Admission::OnReadable(uv_poll_t* h, int status, int) {
  if (status >= 0) static_cast<Admission*>(h->data)->on_readable_();
}

void Admission::Resume() {
  if (paused_ || closed_) return;  // the retry timer restarts it
  (void)uv_poll_start(&poll_, UV_READABLE, &Admission::OnReadable);
}

ipc::UniqueFd Admission::AcceptOne() {
  for (;;) {
    int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd >= 0) return ipc::UniqueFd(fd);
    const int err = errno;
    if (err == EINTR) continue;
    if (err == EAGAIN || err == EWOULDBLOCK) return {};
    if (err == EMFILE || err == ENFILE) {
      if (RefuseForLackOfFds(err)) continue;  // one refused; more may wait
      return {};
    }
    LogRefusal("accept_failed", std::strerror(err));
    return {};
  }
}

void Admission::LogRefusal(const char* reason, const std::string& detail) {
  ++refused_;
  const uint64_t now = uv_now(loop_);
  if (refusal_log_.window_start != 0 && now - refusal_log_.window_start < 1000) {
    ++refusal_log_.suppressed;  // said already this second
    return;
  }
  MB_WARN("refused", "reason=%s detail=\"%s\" suppressed_in_last_second=%llu", reason, LogText(detail).c_str(),
          static_cast<unsigned long long>(refusal_log_.suppressed));
  refusal_log_.window_start = now;
  refusal_log_.suppressed = 0;
}

void Admission::Refuse(ipc::UniqueFd conn, const char* reason, const Status& why) {
  LogRefusal(reason, why.message());
  // Best effort and never blocking: the client reads why, then the EOF.
  std::vector<uint8_t> bytes = ipc::Encode({ipc::kProtocolVersion, 0, 0, ipc::ErrorReply{why.code(), why.message()}});
  bool would_block = false;
  (void)ipc::SendFrame(conn.get(), bytes, {}, &would_block);
  // Closing with a request of the client's unread would reset the connection
  // and lose the reason: stop it sending more, drop what it sent, then close.
  (void)::shutdown(conn.get(), SHUT_RDWR);
  char sink[256];
  while (::recv(conn.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
}

bool Admission::RefuseForLackOfFds(int err) {
  const Status why = OutOfFds(err);
  if (!reserve_fd_.valid()) {
    Pause();
    return false;
  }
  // The reserve fd makes room for exactly one accept: take the connection
  // out of the backlog (else the level-triggered poll fires again at once),
  // tell it why, close it, and take the reserve back.
  reserve_fd_.reset();
  int fd = ::accept4(listen_fd_.get(), nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (fd >= 0) Refuse(ipc::UniqueFd(fd), "out_of_fds", why);
  reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  if (!reserve_fd_.valid()) {
    Pause();
    return false;
  }
  return fd >= 0;
}

void Admission::Pause() {
  // Nothing can be accepted now: stop polling the listener (no spin) and try
  // again shortly; pending connections wait in the backlog meanwhile.
  if (paused_ || closed_) return;
  paused_ = true;
  (void)uv_poll_stop(&poll_);
  LogRefusal("out_of_fds", "no reserve fd either; not accepting for " + std::to_string(kListenRetryMs) + " ms");
  int rc = uv_timer_start(
      &retry_timer_,
      [](uv_timer_t* t) {
        auto* self = static_cast<Admission*>(t->data);
        if (self->closed_) return;
        if (!self->reserve_fd_.valid()) self->reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        self->paused_ = false;
        if (uv_poll_start(&self->poll_, UV_READABLE, &Admission::OnReadable) != 0) self->Pause();
      },
      kListenRetryMs, 0);
  if (rc != 0) MB_ERROR("listen_retry_failed", "error=\"%s\"", uv_strerror(rc));
}

void Admission::ArmHandshakeTimer(uint64_t due_in_ms) {
  if (closed_ || uv_is_active(reinterpret_cast<uv_handle_t*>(&handshake_timer_))) return;
  int rc = uv_timer_start(
      &handshake_timer_, [](uv_timer_t* t) { static_cast<Admission*>(t->data)->on_handshake_due_(); }, due_in_ms, 0);
  if (rc != 0) MB_ERROR("handshake_timer_failed", "error=\"%s\"", uv_strerror(rc));
}

void Admission::Close() {
  if (closed_) return;
  closed_ = true;
  if (polling_) uv_close(reinterpret_cast<uv_handle_t*>(&poll_), nullptr);  // stops it even if paused
  uv_close(reinterpret_cast<uv_handle_t*>(&retry_timer_), nullptr);
  uv_close(reinterpret_cast<uv_handle_t*>(&handshake_timer_), nullptr);
}

void Admission::RemoveSocketFile(const std::string& path) {
  if (bound_) ::unlink(path.c_str());
  bound_ = false;
}

}  // namespace membroker::broker
