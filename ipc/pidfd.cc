#include "membroker/ipc/pidfd.h"

#include <poll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
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

Result<UniqueFd> PidfdOpenIfSupported(pid_t pid) {
  auto fd = PidfdOpen(pid);
  if (!fd.ok() && fd.code() == ErrorCode::kUnsupported) return UniqueFd();
  return fd;
}

}  // namespace membroker::ipc
