#include "membroker/ipc/framing.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <memory>

#include "membroker/ipc/syscall.h"

namespace membroker::ipc {

namespace {
constexpr size_t kCmsgSpace = CMSG_SPACE(sizeof(int) * kMaxFdsPerFrame);

// Closes every fd carried in the control messages of msg.
void CloseReceivedFds(msghdr* msg) {
  for (cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      ::close(fd);
    }
  }
}
}  // namespace

Status SendFrame(int sock, std::span<const uint8_t> bytes, std::span<const int> fds,
                 bool* would_block) {
  if (would_block) *would_block = false;
  if (bytes.size() > kMaxFrameBytes)
    return Status(ErrorCode::kParamInvalid, "frame of " + std::to_string(bytes.size()) +
                                                " bytes exceeds the limit of " +
                                                std::to_string(kMaxFrameBytes));
  if (fds.size() > kMaxFdsPerFrame)
    return Status(ErrorCode::kParamInvalid, "too many fds in one frame");
  iovec iov{const_cast<uint8_t*>(bytes.data()), bytes.size()};
  alignas(cmsghdr) char control[kCmsgSpace];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  if (!fds.empty()) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n >= 0) return Status::Ok();
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (would_block) *would_block = true;
      return Status(ErrorCode::kResourceExhausted, "socket send buffer full");
    }
    return ErrnoStatus("sendmsg", "bytes=" + std::to_string(bytes.size()), errno);
  }
}

Status RecvFrame(int sock, Frame* out, bool* would_block) {
  if (would_block) *would_block = false;
  out->fds.clear();
  // One scratch buffer per thread: resizing out->bytes to the 64 KiB cap would
  // zero-fill it on every call, which cost more than the rest of a request.
  thread_local std::unique_ptr<uint8_t[]> scratch(new uint8_t[kMaxFrameBytes]);
  iovec iov{scratch.get(), kMaxFrameBytes};
  alignas(cmsghdr) char control[kCmsgSpace];
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t n;
  for (;;) {
    n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
    if (n >= 0) break;
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) {
      if (would_block) *would_block = true;
      return Status(ErrorCode::kResourceExhausted, "nothing to read");
    }
    return ErrnoStatus("recvmsg", "", errno);
  }
  if (n == 0 && msg.msg_controllen == 0) return Status(ErrorCode::kNotConnected, "peer closed");
  if (msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) {
    CloseReceivedFds(&msg);
    return Status(ErrorCode::kProtocolError, (msg.msg_flags & MSG_TRUNC)
                                                 ? "frame larger than the limit"
                                                 : "too many fds attached to a frame");
  }
  // Check every control message before adopting any fd: on a bad one, each
  // fd that came is closed here exactly once and none is handed out.
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) {
      CloseReceivedFds(&msg);
      return Status(ErrorCode::kProtocolError, "unexpected control message");
    }
  }
  out->bytes.assign(scratch.get(), scratch.get() + n);
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
      out->fds.emplace_back(fd);
    }
  }
  return Status::Ok();
}

Result<PeerCred> GetPeerCred(int sock) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  MB_RETURN_IF_ERROR(CheckedCall<int>("getsockopt", "SO_PEERCRED", nullptr, [&] {
    return ::getsockopt(sock, SOL_SOCKET, SO_PEERCRED, &cred, &len);
  }));
  return PeerCred{cred.pid, cred.uid, cred.gid};
}

Result<std::vector<gid_t>> GetPeerGroups(int sock) {
  std::vector<gid_t> groups(64);
  for (int attempt = 0; attempt < 2; ++attempt) {
    socklen_t len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
    if (::getsockopt(sock, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len) == 0) {
      groups.resize(len / sizeof(gid_t));
      return groups;
    }
    if (errno != ERANGE) return ErrnoStatus("getsockopt", "SO_PEERGROUPS", errno);
    groups.resize(len / sizeof(gid_t) + 1);
  }
  return Status(ErrorCode::kInternal, "SO_PEERGROUPS kept growing");
}

Result<UniqueFd> ConnectUnix(const std::string& path, int type) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path))
    return Status(ErrorCode::kParamInvalid, "socket path too long: " + path);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int raw = -1;
  MB_RETURN_IF_ERROR(CheckedCall("socket", "AF_UNIX", &raw, [type] {
    return ::socket(AF_UNIX, type | SOCK_CLOEXEC, 0);
  }));
  UniqueFd fd(raw);
  MB_RETURN_IF_ERROR(CheckedCall<int>("connect", path, nullptr, [&] {
    return ::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  }));
  return fd;
}

}  // namespace membroker::ipc
