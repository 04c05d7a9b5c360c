#include "membroker/ipc/private_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace membroker::ipc {

std::string PrivateFileProblem(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0) return std::string("cannot be examined: ") + std::strerror(errno);
  if (!S_ISREG(st.st_mode)) return "is not a regular file";
  if (st.st_uid != ::geteuid())
    return "belongs to uid " + std::to_string(st.st_uid) + ", not to this process's uid " +
           std::to_string(::geteuid());
  if (st.st_mode & 077) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("has mode ") + mode + ": it must be readable by this uid only (chmod 600)";
  }
  return "";
}

}  // namespace membroker::ipc
