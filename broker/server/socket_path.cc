// Unix socket files (socket_path.h).
#include "server/socket_path.h"

#include <grp.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstring>
#include <vector>

#include "log.h"
#include "membroker/ipc/syscall.h"

namespace membroker::broker {

Result<gid_t> ResolveGroup(const std::string& name) {
  if (!name.empty() && std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; })) {
    uint32_t n = 0;
    const auto [end, err] = std::from_chars(name.data(), name.data() + name.size(), n);
    if (err != std::errc() || n == UINT32_MAX)  // (gid_t)-1 means "no change" to chown
      return Status(ErrorCode::kParamInvalid, "group number '" + name + "' is out of range");
    return static_cast<gid_t>(n);
  }
  group grp{};
  group* found = nullptr;
  std::vector<char> buf(16384);
  if (::getgrnam_r(name.c_str(), &grp, buf.data(), buf.size(), &found) != 0 || found == nullptr)
    return Status(ErrorCode::kParamInvalid, "unknown group '" + name + "'");
  return found->gr_gid;
}

Status PrepareSocketPath(const std::string& path) {
  sockaddr_un addr{};
  if (path.empty() || path.size() >= sizeof(addr.sun_path))
    return Status(ErrorCode::kParamInvalid, "socket path is empty or too long: '" + path + "'");
  struct stat st {};
  if (::lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::Ok();
    return ipc::ErrnoStatus("lstat", path, errno);
  }
  if (!S_ISSOCK(st.st_mode))
    return Status(ErrorCode::kAlreadyExists, path + " exists and is not a socket; not touching it");
  // Something is there: is a broker accepting on it?
  for (int type : {SOCK_SEQPACKET, SOCK_STREAM}) {
    ipc::UniqueFd probe(::socket(AF_UNIX, type | SOCK_CLOEXEC, 0));
    if (!probe) return ipc::ErrnoStatus("socket", "AF_UNIX", errno);
    addr.sun_family = AF_UNIX;
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (::connect(probe.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0)
      return Status(ErrorCode::kAlreadyExists,
                    "another broker is serving " + path + "; refusing to start");
    if (errno == EPROTOTYPE) continue;  // a socket of the other type: try that
    if (errno != ECONNREFUSED) return ipc::ErrnoStatus("connect", path, errno);
    break;
  }
  // Nobody accepting: a stale socket from a dead broker.
  if (::unlink(path.c_str()) != 0 && errno != ENOENT) return ipc::ErrnoStatus("unlink", path, errno);
  MB_INFO("stale_socket_removed", "path=\"%s\"", LogText(path).c_str());
  return Status::Ok();
}

Status BindSeqpacket(const std::string& path, mode_t umask_bits, ipc::UniqueFd* out, bool* bound) {
  sockaddr_un addr{};
  if (path.size() >= sizeof(addr.sun_path)) return Status(ErrorCode::kParamInvalid, "socket path too long: " + path);
  MB_RETURN_IF_ERROR(PrepareSocketPath(path));
  int raw = -1;
  MB_RETURN_IF_ERROR(ipc::CheckedCall("socket", "AF_UNIX, SOCK_SEQPACKET", &raw, [] {
    return ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  }));
  out->reset(raw);
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  mode_t old = ::umask(umask_bits);
  int rc = ::bind(raw, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  ::umask(old);
  if (rc != 0) return ipc::ErrnoStatus("bind", path, err);
  *bound = true;
  return Status::Ok();
}

}  // namespace membroker::broker
