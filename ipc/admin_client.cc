#include "membroker/ipc/admin_client.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include "membroker/ipc/framing.h"
#include "membroker/ipc/syscall.h"

namespace membroker::ipc {

namespace {
// Waits until fd is ready for `events` or the deadline passes.
Status WaitReady(int fd, short events, std::chrono::steady_clock::time_point deadline,
                 const std::string& path) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0)
      return Status(ErrorCode::kTimeout, "the broker did not answer on " + path + " in time");
    pollfd p{fd, events, 0};
    int n = 0;
    MB_RETURN_IF_ERROR(CheckedCall("poll", path, &n, [&] {
      return ::poll(&p, 1, static_cast<int>(left.count()));
    }));
    if (n > 0) return Status::Ok();
  }
}
}  // namespace

Result<std::string> AskAdmin(const std::string& admin_path, const std::string& command,
                             std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  Result<UniqueFd> connected = ConnectUnix(admin_path, SOCK_STREAM);
  if (!connected.ok()) {
    // EPROTOTYPE: a socket of another type there. The broker's client socket
    // (SOCK_SEQPACKET) is the one people point at by mistake: say so.
    if (connected.status().message().find(std::strerror(EPROTOTYPE)) != std::string::npos &&
        ConnectUnix(admin_path, SOCK_SEQPACKET).ok())
      return Status(ErrorCode::kParamInvalid, admin_path + " is a broker's client socket, not its admin socket: use " +
                                                  admin_path + ".admin (or --socket " + admin_path + ")");
    return connected.status();
  }
  UniqueFd fd = std::move(*connected);
  const std::string line = command + "\n";
  for (size_t sent = 0; sent < line.size();) {
    MB_RETURN_IF_ERROR(WaitReady(fd.get(), POLLOUT, deadline, admin_path));
    // MSG_NOSIGNAL: a broker that closes first gives EPIPE here, not SIGPIPE.
    ssize_t n = ::send(fd.get(), line.data() + sent, line.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK) continue;
      if (err == EPIPE || err == ECONNRESET)
        return Status(ErrorCode::kProtocolError,
                      "the broker closed the connection before reading the command");
      return ErrnoStatus("send", admin_path, err);
    }
    sent += static_cast<size_t>(n);
  }
  std::string reply;
  char buf[65536];
  for (;;) {
    MB_RETURN_IF_ERROR(WaitReady(fd.get(), POLLIN, deadline, admin_path));
    ssize_t n = ::recv(fd.get(), buf, sizeof(buf), MSG_DONTWAIT);
    if (n < 0) {
      const int err = errno;
      if (err == EINTR || err == EAGAIN || err == EWOULDBLOCK) continue;
      if (err == ECONNRESET) break;
      return ErrnoStatus("recv", admin_path, err);
    }
    if (n == 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  if (reply.empty())
    return Status(ErrorCode::kProtocolError, "the broker closed the connection without a reply");
  return reply;
}

}  // namespace membroker::ipc
