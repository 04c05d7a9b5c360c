// What the C API's files (membroker/membroker.h) share: the C client, and
// how errors are reported - a code, plus a thread-local message for
// mb_last_error_message() - with no C++ exception ever crossing into C.
#pragma once

#include <deque>
#include <mutex>
#include <new>
#include <string>

#include "membroker/client.h"
#include "membroker/membroker.h"
#include "membroker/status.h"

struct mb_client {
  membroker::Client client;
  // Events taken from the broker and not yet handed out (mb_wait_event
  // hands them out one at a time).
  std::mutex events_mu;
  std::deque<membroker::NameEvent> events;
  uint64_t events_dropped = 0;
};

namespace membroker::c_api {

inline thread_local std::string t_last_error;

inline int Fail(const Status& st) {
  t_last_error = st.message();
  return static_cast<int>(st.code());
}
inline int Fail(int code, const char* message) {
  t_last_error = message;
  return code;
}
inline int Done(const Status& st) { return st.ok() ? MB_OK : Fail(st); }

// The C API never lets a C++ exception out (allocation failure included).
template <typename Fn>
int Guard(Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Fail(MB_RESOURCE_EXHAUSTED, "out of memory in the client library");
  } catch (...) {
    return Fail(MB_INTERNAL, "unexpected exception in the client library");
  }
}

}  // namespace membroker::c_api

#define MB_NEED(cond, what)                                     \
  do {                                                          \
    if (!(cond)) return membroker::c_api::Fail(MB_PARAM_INVALID, what); \
  } while (0)
