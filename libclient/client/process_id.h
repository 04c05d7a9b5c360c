// This process's pid without a system call per ask: read once, and again in
// a forked child (pthread_atfork), so a Client can tell it is in a child.
#pragma once

#include <pthread.h>
#include <unistd.h>

#include <atomic>

namespace membroker::detail {

inline pid_t CurrentPid() {
  static std::atomic<pid_t> pid{0};
  static const bool registered = [] {
    pid.store(::getpid());
    ::pthread_atfork(nullptr, nullptr, [] { pid.store(::getpid()); });
    return true;
  }();
  (void)registered;
  return pid.load(std::memory_order_relaxed);
}

}  // namespace membroker::detail
