// Test support: start the real membrokerd binary in a private temp directory,
// wait for its readiness line (never a sleep), query its admin socket, count its
// fds, and run client code in real child processes.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace membroker::testing {

class BrokerProcess {
 public:
  // Starts membrokerd with extra flags; aborts the test on failure. With
  // log_to_file its stderr goes to log_path() instead of the test's.
  // fd_limit: the broker's RLIMIT_NOFILE (soft and hard), 0 for the test's.
  // cgroup_procs: a cgroup.procs file the broker process joins before exec.
  explicit BrokerProcess(std::vector<std::string> extra_args = {}, bool log_to_file = false,
                         uint64_t fd_limit = 0, const std::string& cgroup_procs = "");
  ~BrokerProcess();

  const std::string& socket() const { return socket_; }
  const std::string& admin_socket() const { return admin_; }
  const std::string& dir() const { return dir_; }
  std::string log_path() const { return dir_ + "/broker.log"; }
  pid_t pid() const { return pid_; }

  // Raw reply of one admin command.
  std::string Admin(const std::string& command) const;
  // One numeric field of `stats --json`.
  uint64_t Stat(const std::string& key) const;
  // Waits (bounded, 10 s) until Stat(key) == value; returns the last value.
  uint64_t WaitForStat(const std::string& key, uint64_t value) const;
  // Entries in /proc/<broker>/fd.
  size_t FdCount() const;

  // SIGTERM and wait; returns the exit status (-1 if it did not exit normally).
  int Stop();
  // SIGKILL and wait: the broker dies holding everything (no cleanup).
  void Kill();
  // Starts a new broker on the same sockets and state file (after Kill or
  // Stop), with the same flags; waits for it to be ready.
  void Restart();
  // Starts a new broker with --take-over on the same sockets, waits for it to
  // be ready, then for the old one to exit: returns the old one's exit code.
  // extra_args: the new broker's flags in place of the old one's.
  int TakeOver(std::optional<std::vector<std::string>> extra_args = std::nullopt);

 private:
  void Start();
  std::string dir_, socket_, admin_;
  std::vector<std::string> args_;
  bool log_to_file_ = false;
  uint64_t fd_limit_ = 0;
  std::string cgroup_procs_;
  pid_t pid_ = -1;
};

// Starts a membrokerd and returns its exit code and stderr, for failure tests.
struct RunResult {
  int exit_code = -1;
  std::string output;
};
RunResult RunBrokerExpectingExit(const std::vector<std::string>& args);

// Runs a program (argv[0] is its path) to its end; its exit code and its
// stdout and stderr together.
RunResult RunProgram(const std::vector<std::string>& argv);

// Runs fn in a forked child that exits with fn's return value.
pid_t ForkChild(const std::function<int()>& fn);
// Waits for a child; returns its exit code, or 128+signal. A child still
// running after 100 s is killed and the test fails.
int WaitChild(pid_t pid);

// A pipe for a parent and one child to exchange short lines.
class Channel {
 public:
  Channel();
  ~Channel();
  // Call in the child after fork: use the child's ends only.
  void AsChild();
  void AsParent();
  void Send(const std::string& line);
  // Empty string on EOF, or after 60 s without a whole line.
  std::string Receive();

 private:
  int to_child_[2];
  int to_parent_[2];
  bool child_ = false;
};

// Path of a binary built in this tree (set by CMake).
// membrokerd, membrokerctl, tests/NAME for the test helpers (net_module_probe, engine_agent, device_peer),
// examples/NAME otherwise.
std::string BinaryPath(const char* name);

}  // namespace membroker::testing
