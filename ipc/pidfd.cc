#include "membroker/ipc/pidfd.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <fcntl.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "membroker/ipc/syscall.h"

namespace membroker::ipc {

Result<UniqueFd> PidfdOpen(pid_t pid) {
  if (pid <= 0) return Status(ErrorCode::kParamInvalid, "pid " + std::to_string(pid) + " is invalid");
  long fd = ::syscall(SYS_pidfd_open, pid, 0);
  if (fd < 0) {
    if (errno == ESRCH)
      return Status(ErrorCode::kNotFound, "no process with pid " + std::to_string(pid));
    if (errno == ENOSYS)  // kernels before 5.3, and valgrind
      return Status(ErrorCode::kUnsupported, "pidfd_open is not available");
    return ErrnoStatus("pidfd_open", "pid=" + std::to_string(pid), errno);
  }
  // pidfd_open sets close-on-exec itself.
  return UniqueFd(static_cast<int>(fd));
}

bool PidfdAlive(int pidfd) {
  if (pidfd < 0) return true;  // no pidfd support: only the pid itself was checked
  // A pidfd polls readable once its process has exited.
  pollfd p{pidfd, POLLIN, 0};
  return ::poll(&p, 1, 0) == 0;
}

Result<uint64_t> ProcessStartTime(pid_t pid) {
  if (pid <= 0) return Status(ErrorCode::kParamInvalid, "pid " + std::to_string(pid) + " is invalid");
  const std::string path = "/proc/" + std::to_string(pid) + "/stat";
  int raw = -1;
  Status opened = CheckedCall("open", path, &raw, [&] { return ::open(path.c_str(), O_RDONLY | O_CLOEXEC); });
  if (!opened.ok()) {
    if (opened.code() == ErrorCode::kNotConnected)  // ENOENT
      return Status(ErrorCode::kNotFound, "pid " + std::to_string(pid) + " does not name a running process");
    if (opened.code() == ErrorCode::kResourceExhausted)
      return Status(ErrorCode::kResourceExhausted,
                    "the broker is out of file descriptors (checking pid " + std::to_string(pid) + ")");
    return opened;
  }
  UniqueFd fd(raw);
  char buf[1024];
  ssize_t n = 0;
  MB_RETURN_IF_ERROR(CheckedCall("read", path, &n, [&] { return ::read(fd.get(), buf, sizeof(buf) - 1); }));
  buf[n] = '\0';
  // "pid (comm) state ppid ...": comm may hold spaces and parentheses, so
  // count the fields after the last ')'. starttime is field 22.
  const char* p = std::strrchr(buf, ')');
  if (p == nullptr) return Status(ErrorCode::kInternal, path + " has no command field");
  ++p;
  for (int field = 3; field < 22; ++field) {
    while (*p == ' ') ++p;
    while (*p != ' ' && *p != '\0') ++p;
    if (*p == '\0') return Status(ErrorCode::kInternal, path + " ends before field 22");
  }
  char* end = nullptr;
  unsigned long long start = std::strtoull(p, &end, 10);
  if (end == p) return Status(ErrorCode::kInternal, path + ": field 22 is not a number");
  return static_cast<uint64_t>(start);
}

Result<UniqueFd> PidfdOpenIfSupported(pid_t pid) {
  auto fd = PidfdOpen(pid);
  if (!fd.ok() && fd.code() == ErrorCode::kUnsupported) return UniqueFd();
  return fd;
}

}  // namespace membroker::ipc
