// What the hand-off benchmarks share: one clock for producer and consumer
// (CLOCK_MONOTONIC), a buffer filled and summed word by word (the consumer
// reads every byte), short lines over a control socket, and pinning to one CPU.
#pragma once

#include <sched.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace membroker::bench {

// "4K,1M,64M,1G" as bytes, in order (K, M, G: binary units).
inline std::vector<size_t> ParseSizes(const std::string& list) {
  std::vector<size_t> out;
  for (size_t at = 0; at <= list.size();) {
    size_t comma = list.find(',', at);
    if (comma == std::string::npos) comma = list.size();
    if (comma > at) {
      const std::string one = list.substr(at, comma - at);
      size_t n = std::strtoull(one.c_str(), nullptr, 10);
      switch (one.back()) {
        case 'K': n <<= 10; break;
        case 'M': n <<= 20; break;
        case 'G': n <<= 30; break;
        default: break;
      }
      out.push_back(n);
    }
    at = comma + 1;
  }
  return out;
}

// The middle value (the upper one of an even count); 0 for none.
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return v[v.size() / 2];
}

inline uint64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Fill and Sum are the instruments every peer is measured with, so each
// binary must run the same loop at the same place. Inlined, each caller got
// its own copy wherever the code around it put it, and the read of 1 MiB from
// cache took 18.0 or 35.6 us (one or two cycles per 16 bytes) by where the
// copy's loop fell (the same instructions; in the slow copy the loop's last
// branch straddled a 64-byte boundary): bench_channel's subscriber was slow
// and bench_iceoryx_handoff's fast, and a change of the publisher's code
// only swapped them (2026-12-05). Out of line and 64-byte aligned, the loop
// sits at the same offset in every binary.
[[gnu::noinline, gnu::aligned(64)]] inline void Fill(void* p, size_t n, uint64_t seed) {
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) w[i] = i ^ seed;
}

[[gnu::noinline, gnu::aligned(64)]] inline uint64_t Sum(const void* p, size_t n) {
  const auto* w = static_cast<const uint64_t*>(p);
  uint64_t s = 0;
  for (size_t i = 0; i < n / 8; ++i) s += w[i];
  return s;
}

// One hand-off case of the channel table, as bench/run names it on the
// command line of both channel benches: --case WAKE:SUBSCRIBERS:BYTES
// (futex:8:1048576), so that it can alternate the two peers case by case.
struct HandOffCase {
  std::string wake;  // "futex" or "poll"
  size_t subscribers = 0;
  size_t size = 0;
  static bool Parse(const char* text, HandOffCase* out) {
    char wake[8] = {};
    unsigned long subscribers = 0, size = 0;
    if (std::sscanf(text, "%7[a-z]:%lu:%lu", wake, &subscribers, &size) != 3) return false;
    out->wake = wake;
    out->subscribers = subscribers;
    out->size = size;
    return (out->wake == "futex" || out->wake == "poll") && subscribers >= 1 && subscribers <= 16 && size >= 8;
  }
};

// Iterations of a hand-off of `size` bytes: enough for a median, few enough
// that the largest cases stay short.
inline int HandOffIterations(size_t size, bool quick) {
  if (size >= (size_t{64} << 20)) return quick ? 15 : 30;
  if (size >= (size_t{1} << 20)) return quick ? 200 : 400;
  return quick ? 1000 : 2000;
}

inline void SendLine(int fd, const std::string& s) { (void)!::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }

// One line (one SEQPACKET message), or "" at EOF.
inline std::string RecvLine(int fd) {
  char buf[256];
  const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

// Pins this process to CPU 0 (its children inherit it): the benches' --one-cpu,
// where a wake-up is a context switch rather than an idle vCPU's.
// Pins the calling thread, or the thread `tid` (a process's pid names its
// main thread only; threads it starts later inherit the mask).
inline bool PinToCpu(int cpu, pid_t tid = 0) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return ::sched_setaffinity(tid, sizeof(set), &set) == 0;
}
inline bool PinToCpu0() { return PinToCpu(0); }

// Where subscriber `index` of a channel bench runs, by the benches' CPU
// placement (the publisher is on CPU 0 when placed): "cross", CPU 1;
// "spread", CPU index+1 modulo the CPUs, so that eight subscribers on two
// CPUs are four and four (left to the scheduler, they were 4:4 in some runs
// and 6:2 in others, for membroker and iceoryx alike, and the hand-off time
// followed that split); otherwise wherever the scheduler puts it.
inline bool PlaceSubscriber(const char* cpus, size_t index) {
  if (!std::strcmp(cpus, "cross")) return PinToCpu(1);
  if (!std::strcmp(cpus, "spread")) {
    const long n = ::sysconf(_SC_NPROCESSORS_ONLN);
    return PinToCpu(static_cast<int>((index + 1) % static_cast<size_t>(n > 0 ? n : 1)));
  }
  return true;
}

}  // namespace membroker::bench
