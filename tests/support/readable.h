// Whether fd becomes readable within timeout_ms (a bound for a hung peer,
// never a measure of speed: tests wait long and fail only on "never").
#pragma once

#include <poll.h>

#include <cerrno>

namespace membroker::testing {

inline bool Readable(int fd, int timeout_ms) {
  pollfd p{fd, POLLIN, 0};
  int n;
  do n = ::poll(&p, 1, timeout_ms);
  while (n < 0 && errno == EINTR);
  return n == 1 && (p.revents & POLLIN) != 0;
}

}  // namespace membroker::testing
