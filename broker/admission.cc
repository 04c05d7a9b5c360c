// Admission at the limits: connections the broker cannot take are refused
// with a reason (an ErrorReply with request id 0, then the close), never left
// hanging in the listen backlog; connections that never say hello are closed
// after --handshake-timeout-ms and have a cap of their own, so they cannot
// lock real clients out; refusals are logged at most once a second.
#include <fcntl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "broker.h"
#include "log.h"
#include "uv_status.h"

namespace membroker::broker {

namespace {
constexpr uint64_t kListenRetryMs = 100;  // listener paused without a reserve fd
}  // namespace

uint64_t FdLimit() {
  rlimit rl{};
  return ::getrlimit(RLIMIT_NOFILE, &rl) == 0 ? static_cast<uint64_t>(rl.rlim_cur) : 0;
}

void Broker::LogRefusal(const char* reason, const std::string& detail) {
  ++counters_.connections_refused;
  const uint64_t now = uv_now(&loop_);
  if (refusal_log_.window_start != 0 && now - refusal_log_.window_start < 1000) {
    ++refusal_log_.suppressed;  // said already this second
    return;
  }
  MB_WARN("refused", "reason=%s detail=\"%s\" suppressed_in_last_second=%llu", reason,
          LogText(detail).c_str(), static_cast<unsigned long long>(refusal_log_.suppressed));
  refusal_log_.window_start = now;
  refusal_log_.suppressed = 0;
}

void Broker::Refuse(ipc::UniqueFd conn, const char* reason, const Status& why) {
  LogRefusal(reason, why.message());
  // Best effort and never blocking: the client reads why, then the EOF.
  std::vector<uint8_t> bytes =
      ipc::Encode({ipc::kProtocolVersion, 0, 0, ipc::ErrorReply{why.code(), why.message()}});
  bool would_block = false;
  (void)ipc::SendFrame(conn.get(), bytes, {}, &would_block);
  // Closing with a request of the client's unread would reset the connection
  // and lose the reason: stop it sending more, drop what it sent, then close.
  (void)::shutdown(conn.get(), SHUT_RDWR);
  char sink[256];
  while (::recv(conn.get(), sink, sizeof(sink), MSG_DONTWAIT) > 0) {
  }
}

Status OutOfFds(int err) {
  return Status(ErrorCode::kResourceExhausted,
                std::string("the broker is out of file descriptors (") +
                    (err == ENFILE ? "the system's table is full" : "limit " + std::to_string(FdLimit())) +
                    "); connection refused, try again later");
}

bool Broker::RefuseForLackOfFds(int err) {
  const Status why = OutOfFds(err);
  if (!reserve_fd_.valid()) {
    PauseListening();
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
    PauseListening();
    return false;
  }
  return fd >= 0;
}

void Broker::PauseListening() {
  // Nothing can be accepted now: stop polling the listener (no spin) and try
  // again shortly; pending connections wait in the backlog meanwhile.
  if (listening_paused_ || stopping_) return;
  listening_paused_ = true;
  (void)uv_poll_stop(&listen_poll_);
  LogRefusal("out_of_fds", "no reserve fd either; not accepting for " + std::to_string(kListenRetryMs) + " ms");
  int rc = uv_timer_start(
      &listen_retry_timer_,
      [](uv_timer_t* t) {
        auto* b = static_cast<Broker*>(t->data);
        if (b->stopping_) return;
        if (!b->reserve_fd_.valid()) b->reserve_fd_.reset(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        b->listening_paused_ = false;
        if (uv_poll_start(&b->listen_poll_, UV_READABLE, &Broker::OnListenReadable) != 0) b->PauseListening();
      },
      kListenRetryMs, 0);
  if (rc != 0) MB_ERROR("listen_retry_failed", "error=\"%s\"", uv_strerror(rc));
}

void Broker::ArmHandshakeTimer() {
  if (uv_is_active(reinterpret_cast<uv_handle_t*>(&handshake_timer_)) || handshaking_.empty()) return;
  // Ids grow with every accept: the first one waiting has waited longest.
  const Session* oldest = sessions_.at(*handshaking_.begin());
  const uint64_t now = uv_now(&loop_), due = oldest->accepted_ms + options_.handshake_timeout_ms;
  int rc = uv_timer_start(
      &handshake_timer_, [](uv_timer_t* t) { static_cast<Broker*>(t->data)->CloseSilentSessions(); },
      due > now ? due - now : 0, 0);
  if (rc != 0) MB_ERROR("handshake_timer_failed", "error=\"%s\"", uv_strerror(rc));
}

void Broker::EvictOldestHandshaking() {
  if (handshaking_.empty()) return;
  ++counters_.connections_refused;
  CloseSession(*sessions_.at(*handshaking_.begin()), CloseReason::kHandshakeTimeout,
               "no hello yet, and " + std::to_string(options_.max_clients) +
                   " connections were waiting for theirs: closed to make room");
}

void Broker::CloseSilentSessions() {
  const uint64_t now = uv_now(&loop_);
  while (!handshaking_.empty()) {
    Session& s = *sessions_.at(*handshaking_.begin());
    if (now - s.accepted_ms < options_.handshake_timeout_ms) break;  // the rest came later
    CloseSession(s, CloseReason::kHandshakeTimeout,
                 "no hello within " + std::to_string(options_.handshake_timeout_ms) + " ms");
  }
  ArmHandshakeTimer();
}

}  // namespace membroker::broker
