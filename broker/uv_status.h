// libuv's calls return 0 or a negative errno; UvStatus turns that into a
// Status naming the call, so no init or start result is dropped.
#pragma once

#include <uv.h>

#include <string>

#include "membroker/status.h"

namespace membroker::broker {

inline Status UvStatus(const char* call, int rc) {
  if (rc == 0) return Status::Ok();
  return Status(rc == UV_ENOMEM || rc == UV_EMFILE || rc == UV_ENFILE ? ErrorCode::kResourceExhausted
                                                                        : ErrorCode::kInternal,
                std::string(call) + ": " + uv_strerror(rc));
}

}  // namespace membroker::broker
