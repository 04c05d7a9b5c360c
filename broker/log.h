// One-line log messages on stderr with a timestamp, for operators.
#pragma once

#include <cstdio>
#include <ctime>

#define MB_LOG(fmt, ...)                                                           \
  do {                                                                             \
    timespec mb_ts_{};                                                             \
    clock_gettime(CLOCK_REALTIME, &mb_ts_);                                        \
    std::fprintf(stderr, "membrokerd[%ld.%03ld] " fmt "\n", (long)mb_ts_.tv_sec,   \
                 mb_ts_.tv_nsec / 1000000L __VA_OPT__(, ) __VA_ARGS__);            \
  } while (0)
