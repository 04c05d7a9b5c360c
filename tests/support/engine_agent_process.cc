#include "engine_agent_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>

#include <gtest/gtest.h>

#include "broker_process.h"

namespace membroker::testing {

namespace {
constexpr int kAnswerTimeoutMs = 60'000;
}

EngineAgent::EngineAgent(const std::string& socket) {
  ::signal(SIGPIPE, SIG_IGN);  // a write to an agent that died is an error here, not a signal
  int in[2], out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) std::abort();
  const std::string path = BinaryPath("engine_agent");
  pid_ = ::fork();
  if (pid_ < 0) std::abort();
  if (pid_ == 0) {
    if (::dup2(in[0], 0) < 0 || ::dup2(out[1], 1) < 0) _exit(126);
    const char* argv[] = {path.c_str(), socket.c_str(), nullptr};
    ::execv(argv[0], const_cast<char* const*>(argv));
    _exit(127);
  }
  ::close(in[0]);
  ::close(out[1]);
  to_agent_ = in[1];
  from_agent_ = out[0];
}

EngineAgent::~EngineAgent() {
  if (pid_ < 0) return;
  ::close(to_agent_);  // EOF: the agent finalizes its engine and exits
  // Its exit closes our read end's other side: wait for that, bounded.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kAnswerTimeoutMs);
  char buf[256];
  for (;;) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{from_agent_, POLLIN, 0};
    int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) {
      ADD_FAILURE() << "engine_agent " << pid_ << " did not exit within 60 s of its stdin closing";
      ::kill(pid_, SIGKILL);
      break;
    }
    ssize_t n = ::read(from_agent_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
  }
  ::close(from_agent_);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
}

std::string EngineAgent::Command(const std::string& line) {
  if (pid_ < 0) return "";
  const std::string out = line + "\n";
  for (size_t done = 0; done < out.size();) {
    ssize_t n = ::write(to_agent_, out.data() + done, out.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "";
    done += static_cast<size_t>(n);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kAnswerTimeoutMs);
  for (;;) {
    if (size_t nl = buffered_.find('\n'); nl != std::string::npos) {
      std::string answer = buffered_.substr(0, nl);
      buffered_.erase(0, nl + 1);
      return answer;
    }
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    pollfd p{from_agent_, POLLIN, 0};
    int ready = left.count() > 0 ? ::poll(&p, 1, static_cast<int>(left.count())) : 0;
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return "";
    char buf[4096];
    ssize_t n = ::read(from_agent_, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return "";
    buffered_.append(buf, static_cast<size_t>(n));
  }
}

std::string EngineAgent::Ok(const std::string& line) {
  const std::string answer = Command(line);
  EXPECT_EQ(answer.rfind("ok", 0), 0u) << "engine_agent answered \"" << answer << "\" to \"" << line << "\"";
  return answer.size() > 3 ? answer.substr(3) : "";
}

void EngineAgent::Kill() {
  if (pid_ < 0) return;
  ::kill(pid_, SIGKILL);
  int status = 0;
  while (::waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
  }
  ::close(to_agent_);
  ::close(from_agent_);
  pid_ = -1;
}

}  // namespace membroker::testing
