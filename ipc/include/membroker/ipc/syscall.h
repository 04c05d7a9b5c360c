// The checked system-call seam: every OS call that can fail goes through
// CheckedCall, which retries EINTR and turns errno into a Status naming the
// call, its arguments and, where one is known, a hint.
#pragma once

#include <cerrno>
#include <initializer_list>
#include <string>
#include <string_view>

#include "membroker/status.h"

namespace membroker::ipc {

// Maps an errno to the closest wire error code.
ErrorCode ErrnoToCode(int err);

// A call site's own reading of one errno: the code to report instead of
// ErrnoToCode's, and a hint appended to the message. err 0 matches any errno
// that no earlier override matched.
struct ErrnoOverride {
  int err = 0;
  ErrorCode code = ErrorCode::kInternal;
  std::string_view hint;
};

// "memfd_create(size=4096): Cannot allocate memory (ENOMEM)", with the first
// matching override's code and hint, else ErrnoToCode's code and the seam's
// own hint for this call and errno.
Status ErrnoStatus(std::string_view call, std::string_view args, int err,
                   std::initializer_list<ErrnoOverride> overrides = {});

// Calls fn() until it does not fail with EINTR. On failure (result -1, or
// MAP_FAILED for pointers) returns the errno Status; on success stores the
// result in *out when out is not null.
template <typename R, typename Fn>
Status CheckedCall(std::string_view call, std::string_view args, R* out, Fn&& fn) {
  for (;;) {
    auto r = fn();
    bool failed;
    if constexpr (std::is_pointer_v<decltype(r)>) {
      failed = r == reinterpret_cast<decltype(r)>(-1);
    } else {
      failed = r == -1;
    }
    if (!failed) {
      if (out) *out = static_cast<R>(r);
      return Status::Ok();
    }
    if (errno == EINTR) continue;
    return ErrnoStatus(call, args, errno);
  }
}

}  // namespace membroker::ipc
