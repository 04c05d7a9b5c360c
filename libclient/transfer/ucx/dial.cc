#include "transfer/ucx/dial.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "membroker/ipc/escape.h"
#include "membroker/ipc/unique_fd.h"

namespace membroker::detail {

namespace {

using Clock = std::chrono::steady_clock;

class Call {
 public:
  Call(ipc::UniqueFd fd, const std::string& text, Clock::time_point deadline)
      : fd_(std::move(fd)), text_(text), deadline_(deadline) {}

  // Waits (by the deadline) until the socket is ready for events.
  Status Ready(short events) {
    for (;;) {
      const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline_ - Clock::now()).count();
      if (left <= 0)
        return Status(ErrorCode::kTimeout, "no answer from " + text_ + " in time (is an engine listening there?)");
      pollfd p{fd_.get(), events, 0};
      const int n = ::poll(&p, 1, static_cast<int>(std::min<int64_t>(left, 1000)));
      if (n > 0) return Status::Ok();
      if (n < 0 && errno != EINTR) return Status(ErrorCode::kInternal, std::string("poll: ") + std::strerror(errno));
    }
  }
  Status Connected() {
    MB_RETURN_IF_ERROR(Ready(POLLOUT));
    int err = 0;
    socklen_t len = sizeof(err);
    if (::getsockopt(fd_.get(), SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
    if (err != 0) return Status(ErrorCode::kNotConnected, "cannot reach " + text_ + ": " + std::strerror(err));
    return Status::Ok();
  }
  Status Send(const std::string& bytes) {
    for (size_t sent = 0; sent < bytes.size();) {
      MB_RETURN_IF_ERROR(Ready(POLLOUT));
      const ssize_t n = ::send(fd_.get(), bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
      if (n > 0) {
        sent += static_cast<size_t>(n);
      } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
        return Status(ErrorCode::kNotConnected, "sending to " + text_ + " failed: " + std::strerror(errno));
      }
    }
    return Status::Ok();
  }
  Result<handshake::Frame> Receive() {
    handshake::FrameReader frame;
    for (;;) {
      MB_ASSIGN_OR_RETURN(size_t wanted, frame.Wanted());
      if (wanted == 0) return handshake::Decode(frame.body());
      MB_RETURN_IF_ERROR(Ready(POLLIN));
      uint8_t buf[4096];
      const ssize_t n = ::recv(fd_.get(), buf, std::min(wanted, sizeof(buf)), 0);
      if (n > 0) {
        frame.Append(buf, static_cast<size_t>(n));
      } else if (n == 0) {
        return Status(ErrorCode::kNotConnected,
                      text_ + " closed the connection during the handshake (is it an engine of this version?)");
      } else if (errno != EAGAIN && errno != EINTR) {
        return Status(ErrorCode::kNotConnected, "reading from " + text_ + " failed: " + std::strerror(errno));
      }
    }
  }

 private:
  ipc::UniqueFd fd_;
  std::string text_;
  Clock::time_point deadline_;
};

Status Refused(const std::string& text, const handshake::Refuse& f) {
  const ErrorCode code = f.code == static_cast<int32_t>(ErrorCode::kVersionMismatch) ? ErrorCode::kVersionMismatch
                                                                                     : ErrorCode::kPermissionDenied;
  return Status(code, text + " refused the connection: " + ipc::EscapeText(f.reason));
}

}  // namespace

Result<Dialed> Dial(const SocketAddress& to, const std::string& text, Clock::time_point deadline,
                    const DialRequest& request) {
  ipc::UniqueFd fd(::socket(to.get()->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd.valid()) return Status(ErrorCode::kResourceExhausted, std::string("socket: ") + std::strerror(errno));
  const int one = 1;
  (void)::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  if (::connect(fd.get(), to.get(), to.length) != 0 && errno != EINPROGRESS)
    return Status(ErrorCode::kNotConnected, "cannot reach " + text + ": " + std::strerror(errno));
  Call call(std::move(fd), text, deadline);
  MB_RETURN_IF_ERROR(call.Connected());

  MB_ASSIGN_OR_RETURN(handshake::Frame first, call.Receive());
  if (auto* f = std::get_if<handshake::Refuse>(&first)) return Refused(text, *f);
  auto* challenge = std::get_if<handshake::Challenge>(&first);
  if (challenge == nullptr) return Status(ErrorCode::kProtocolError, text + " did not send a challenge first");
  if (challenge->version != handshake::kVersion)
    return Status(ErrorCode::kVersionMismatch, text + " speaks handshake version " +
                                                   std::to_string(challenge->version) + ", this engine " +
                                                   std::to_string(handshake::kVersion));
  handshake::Proof proof;
  proof.nonce = handshake::Random<32>();
  proof.token = request.token;
  proof.engine = request.engine;
  proof.worker_address = request.worker_address;
  proof.has_secret = !request.secret.empty();
  if (proof.has_secret) proof.mac = handshake::ConnectorMac(request.secret, challenge->nonce, proof);
  MB_RETURN_IF_ERROR(call.Send(handshake::Encode(proof)));

  MB_ASSIGN_OR_RETURN(handshake::Frame answer, call.Receive());
  if (auto* f = std::get_if<handshake::Refuse>(&answer)) return Refused(text, *f);
  auto* accept = std::get_if<handshake::Accept>(&answer);
  if (accept == nullptr) return Status(ErrorCode::kProtocolError, text + " answered the proof with neither yes nor no");
  // Admitted by the secret: the listener proves it holds it too. Admitted by
  // its allow_from: it trusts our address, and we take it at its word.
  if (!accept->by_address &&
      (!proof.has_secret ||
       !handshake::SameMac(
           accept->mac, handshake::ListenerMac(request.secret, proof.nonce, challenge->nonce, proof.token, *accept))))
    return Status(ErrorCode::kPermissionDenied,
                  text + " did not prove it holds the secret (not the engine you meant, or another secret)");
  return Dialed{std::move(accept->engine), std::move(accept->worker_address), accept->token};
}

}  // namespace membroker::detail
