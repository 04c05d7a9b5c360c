// The scheduler's own accounting of a process or thread (/proc/PID/schedstat,
// /proc/PID/task/TID/schedstat): time on a CPU and time waiting on a run
// queue, at nanosecond resolution (unlike the tick-based times in /proc/PID/stat).
#pragma once

#include <fstream>
#include <string>

namespace membroker::bench {

struct SchedStat {
  double cpu_us = 0, wait_us = 0;
};

// Zeros if the file cannot be read (the process or thread has gone).
inline SchedStat ReadSchedStat(const std::string& path) {
  std::ifstream f(path);
  unsigned long long cpu_ns = 0, wait_ns = 0;
  if (!(f >> cpu_ns >> wait_ns)) return {};
  return {cpu_ns / 1e3, wait_ns / 1e3};
}

}  // namespace membroker::bench
