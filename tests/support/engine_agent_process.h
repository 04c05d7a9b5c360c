// Test support: one engine_agent process (tests/net/engine_agent.cc), a
// transfer engine in a process of its own, driven by one line per command and
// answering one line each. Used where a test needs its peer engine to be a
// real process it can SIGKILL.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>

namespace membroker::testing {

class EngineAgent {
 public:
  // Starts engine_agent connected to the broker at socket; aborts the test on failure.
  explicit EngineAgent(const std::string& socket);
  // Closes its stdin (it finalizes and exits), waits up to 60 s, then SIGKILLs.
  ~EngineAgent();
  EngineAgent(const EngineAgent&) = delete;
  EngineAgent& operator=(const EngineAgent&) = delete;

  // Sends one command and returns its answer ("ok ..." or "err CODE ..."), or
  // "" when no whole line came within 60 s or the agent is gone.
  std::string Command(const std::string& line);
  // The words after "ok" of an answer that must be ok (a failure otherwise).
  std::string Ok(const std::string& line);
  // SIGKILL, and wait for it.
  void Kill();
  pid_t pid() const { return pid_; }

 private:
  pid_t pid_ = -1;
  int to_agent_ = -1;
  int from_agent_ = -1;
  std::string buffered_;
};

// What engine_agent's "fill INDEX SEED" writes at offset.
inline unsigned char AgentPattern(uint64_t seed, size_t offset) {
  return static_cast<unsigned char>(offset * 131 + (offset >> 12) * 17 + seed * 29 + 1);
}

}  // namespace membroker::testing
