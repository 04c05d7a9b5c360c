// A client's wake socket (WakeRequest): the sending end of a datagram socket
// pair it made. When the broker queues something the client takes with a
// request of its own - a name event, a notify for its engine - and nobody is
// waiting for it in the broker, it sends one byte there, so the client can
// poll the other end from an event loop instead of holding a thread in
// WaitEvents. The byte is a hint: the client drains the socket, then asks.
#include <sys/socket.h>

#include <cerrno>

#include "server/session.h"

namespace membroker::broker {
namespace {

// Only an AF_UNIX datagram socket: a send on it with MSG_DONTWAIT never
// blocks whatever flags the client set on the shared file, and it reaches
// only the socket's own pair.
Status CheckWakeSocket(int fd) {
  int domain = 0, type = 0;
  socklen_t len = sizeof(domain);
  if (::getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0)
    return Status(ErrorCode::kParamInvalid, "the wake fd is not a socket");
  len = sizeof(type);
  if (::getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || domain != AF_UNIX || type != SOCK_DGRAM)
    return Status(ErrorCode::kParamInvalid, "the wake fd must be an AF_UNIX SOCK_DGRAM socket");
  return Status::Ok();
}

}  // namespace

Status SetWakeSocket(Session& s, ipc::UniqueFd fd) {
  MB_RETURN_IF_ERROR(CheckWakeSocket(fd.get()));
  s.wake = std::move(fd);
  return Status::Ok();
}

void Wake(const Session& s) {
  if (!s.wake) return;
  const char byte = 1;
  // EAGAIN: the client has unread wakes already, which is all one says.
  // Any other failure (the client closed its end) is the client's to notice.
  (void)::send(s.wake.get(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

}  // namespace membroker::broker
