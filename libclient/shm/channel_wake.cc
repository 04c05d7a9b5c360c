#include "shm/channel_wake.h"

#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "membroker/ipc/syscall.h"

namespace membroker::detail {
namespace {

// "\0membroker-channel-wake/PID/NONCE" (an abstract address: no file, gone
// with the socket).
socklen_t WakeAddress(int32_t pid, uint64_t nonce, sockaddr_un* addr) {
  std::memset(addr, 0, sizeof(*addr));
  addr->sun_family = AF_UNIX;
  const int n = std::snprintf(addr->sun_path + 1, sizeof(addr->sun_path) - 1, "membroker-channel-wake/%d/%016llx",
                              static_cast<int>(pid), static_cast<unsigned long long>(nonce));
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

// The process's one sending socket, made on first use.
int Sender() {
  static const int fd = ::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  return fd;
}

}  // namespace

void SendChannelWake(int32_t pid, uint64_t nonce) {
  const int fd = Sender();
  if (fd < 0 || pid <= 0 || nonce == 0) return;
  sockaddr_un addr;
  const socklen_t len = WakeAddress(pid, nonce, &addr);
  const char byte = 1;
  // EAGAIN: wakes are unread already; ECONNREFUSED: the subscriber has gone.
  (void)::sendto(fd, &byte, 1, MSG_DONTWAIT | MSG_NOSIGNAL, reinterpret_cast<sockaddr*>(&addr), len);
}

Result<ChannelWakeFd> ChannelWakeFd::Open(int publisher_pidfd) {
  ChannelWakeFd w;
  while (w.nonce_ == 0)
    if (::getrandom(&w.nonce_, sizeof(w.nonce_), 0) != sizeof(w.nonce_))
      return ipc::ErrnoStatus("getrandom", "a channel wake nonce", errno);
  w.socket_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!w.socket_) return ipc::ErrnoStatus("socket", "a channel wake socket", errno);
  sockaddr_un addr;
  const socklen_t len = WakeAddress(static_cast<int32_t>(::getpid()), w.nonce_, &addr);
  if (::bind(w.socket_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0)
    return ipc::ErrnoStatus("bind", "a channel wake socket", errno);
  w.epoll_.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!w.epoll_) return ipc::ErrnoStatus("epoll_create1", "a channel wake fd", errno);
  for (int fd : {w.socket_.get(), publisher_pidfd}) {
    if (fd < 0) continue;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    if (::epoll_ctl(w.epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      return ipc::ErrnoStatus("epoll_ctl", "a channel wake fd", errno);
  }
  return w;
}

void ChannelWakeFd::Drain() const {
  char buf[64];
  while (::recv(socket_.get(), buf, sizeof(buf), MSG_DONTWAIT) > 0) {
  }
}

}  // namespace membroker::detail
