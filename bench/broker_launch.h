// Starting a membrokerd for a benchmark: fork, exec with --ready-fd 3, and wait
// for its readiness line (the broker closes the pipe once it serves). The
// broker gets SIGTERM if the benchmark dies first (killed, or a failed run's
// exit), so no broker outlives the run that started it.
#pragma once

#include <sys/prctl.h>
#include <unistd.h>

#include <csignal>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace membroker::bench {

// Returns the broker's pid once it is ready; exits the benchmark if it is not.
inline pid_t LaunchBroker(const std::string& binary, std::vector<std::string> args) {
  int ready[2];
  if (::pipe(ready) != 0) std::exit(1);
  const pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid == 0) {
    if (::prctl(PR_SET_PDEATHSIG, SIGTERM) != 0 || ::getppid() != parent) _exit(126);
    ::dup2(ready[1], 3);
    args.insert(args.begin(), binary);
    args.insert(args.end(), {"--ready-fd", "3"});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(binary.c_str(), argv.data());
    _exit(127);
  }
  ::close(ready[1]);
  char buf[64];
  if (::read(ready[0], buf, sizeof(buf)) <= 0) {
    std::fprintf(stderr, "bench: broker %s did not start\n", binary.c_str());
    std::exit(1);
  }
  ::close(ready[0]);
  return pid;
}

}  // namespace membroker::bench
