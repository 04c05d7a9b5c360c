// Raw SOCK_SEQPACKET send and receive with at most one fd (SCM_RIGHTS): the
// bare system calls the benchmarks' floors and hand-rolled peers are made of,
// deliberately without membroker's framing.
#pragma once

#include <sys/socket.h>

#include <cstddef>
#include <cstring>

namespace membroker::bench {

// Sends len bytes and, if fd >= 0, the fd. Returns sendmsg's result.
inline ssize_t RawSend(int sock, const void* data, size_t len, int fd = -1) {
  iovec iov{const_cast<void*>(data), len};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  if (fd >= 0) {
    h.msg_control = control;
    h.msg_controllen = sizeof(control);
    cmsghdr* c = CMSG_FIRSTHDR(&h);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(c), &fd, sizeof(int));
  }
  return ::sendmsg(sock, &h, 0);
}

// Receives one message into buf; *fd gets the fd it carried, or -1.
inline ssize_t RawRecv(int sock, void* buf, size_t cap, int* fd) {
  iovec iov{buf, cap};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  msghdr h{};
  h.msg_iov = &iov;
  h.msg_iovlen = 1;
  h.msg_control = control;
  h.msg_controllen = sizeof(control);
  ssize_t n = ::recvmsg(sock, &h, MSG_CMSG_CLOEXEC);
  *fd = -1;
  if (n > 0 && h.msg_controllen > 0) std::memcpy(fd, CMSG_DATA(CMSG_FIRSTHDR(&h)), sizeof(int));
  return n;
}

}  // namespace membroker::bench
