#include "client/wake_socket.h"

#include <sys/socket.h>

#include <cerrno>

#include "membroker/ipc/syscall.h"

namespace membroker::detail {

Result<int> WakeSocket::Open(bool* made) {
  std::lock_guard<std::mutex> lk(mu_);
  *made = false;
  if (receive_) return receive_.get();
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pair) != 0)
    return ipc::ErrnoStatus("socketpair", "the wake socket", errno);
  receive_.reset(pair[0]);
  send_.reset(pair[1]);
  *made = true;
  return receive_.get();
}

void WakeSocket::Close() {
  std::lock_guard<std::mutex> lk(mu_);
  receive_.reset();
  send_.reset();
}

int WakeSocket::sending() const {
  std::lock_guard<std::mutex> lk(mu_);
  return send_ ? send_.get() : -1;
}

void WakeSocket::Poke() const {
  std::lock_guard<std::mutex> lk(mu_);
  const char byte = 1;
  // EAGAIN: wakes are unread already, which is all a byte says.
  if (send_) (void)::send(send_.get(), &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
}

void WakeSocket::Drain() const {
  std::lock_guard<std::mutex> lk(mu_);
  if (!receive_) return;
  char buf[64];
  while (::recv(receive_.get(), buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace membroker::detail
