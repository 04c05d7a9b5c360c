#include "membroker/ipc/syscall.h"

#include <cstring>

namespace membroker::ipc {

ErrorCode ErrnoToCode(int err) {
  switch (err) {
    case ENOMEM:
    case ENOSPC:
    case EMFILE:
    case ENFILE:
    case EAGAIN:
      return ErrorCode::kResourceExhausted;
    case EACCES:
    case EPERM:
      return ErrorCode::kPermissionDenied;
    case EINVAL:
    case EFBIG:
      return ErrorCode::kParamInvalid;
    case ENOENT:
    case ECONNREFUSED:
    case EPIPE:
    case ECONNRESET:
    case ENOTCONN:
      return ErrorCode::kNotConnected;
    case ETIMEDOUT:
      return ErrorCode::kTimeout;
    case EEXIST:
      return ErrorCode::kAlreadyExists;
    case EBUSY:
      return ErrorCode::kBusy;
    case ENODEV:  // e.g. memfd_create of a huge page size the kernel has no pool for
      return ErrorCode::kUnsupported;
    default:
      return ErrorCode::kInternal;
  }
}

static std::string_view Hint(std::string_view call, int err) {
  if (err == EMFILE) return " (hint: raise the open-file limit, ulimit -n)";
  if (err == ENOMEM && call == "mmap") return " (hint: vm.max_map_count may be too low)";
  if (err == ENODEV && call.find("huge") != std::string_view::npos)
    return " (this kernel has no huge pages of this size at all: no "
           "/sys/kernel/mm/hugepages/hugepages-<size>kB; 1 GiB pages need a CPU with pdpe1gb)";
  if ((err == ENOMEM || err == ENOSPC) && call.find("huge") != std::string_view::npos)
    return " (no free huge pages of this size; reserve some in /proc/sys/vm/nr_hugepages for "
           "2 MiB, /sys/kernel/mm/hugepages/hugepages-1048576kB/nr_hugepages for 1 GiB)";
  return "";
}

Status ErrnoStatus(std::string_view call, std::string_view args, int err,
                   std::initializer_list<ErrnoOverride> overrides) {
  std::string msg(call);
  msg += "(";
  msg += args;
  msg += "): ";
  msg += std::strerror(err);
  for (const ErrnoOverride& o : overrides) {
    if (o.err != 0 && o.err != err) continue;
    if (!o.hint.empty()) {
      msg += " (";
      msg += o.hint;
      msg += ")";
    }
    return Status(o.code, std::move(msg));
  }
  msg += Hint(call, err);
  return Status(ErrnoToCode(err), std::move(msg));
}

}  // namespace membroker::ipc
