#include "broker_process.h"

#include <poll.h>
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <thread>

#include <gtest/gtest.h>

#include "membroker/ipc/admin_client.h"

namespace membroker::testing {

namespace {

// Reads until EOF, for at most 100 s (far past anything a test asks of a
// process, however loaded the machine): false when that passed first.
bool ReadAllFromFd(int fd, std::string* out) {
  const auto bound = std::chrono::steady_clock::now() + std::chrono::seconds(100);
  char buf[4096];
  for (;;) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(bound - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready == 0) return false;
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return true;
    out->append(buf, static_cast<size_t>(n));
  }
}

pid_t SpawnBroker(const std::vector<std::string>& args, int ready_write, int out_fd,
                  uint64_t fd_limit = 0, const std::string& cgroup_procs = "") {
  pid_t pid = ::fork();
  if (pid == 0) {
    if (!cgroup_procs.empty()) {
      FILE* f = std::fopen(cgroup_procs.c_str(), "w");
      if (f == nullptr || std::fprintf(f, "%d\n", static_cast<int>(::getpid())) < 0 || std::fclose(f) != 0)
        _exit(125);
    }
    if (fd_limit != 0) {
      rlimit rl{fd_limit, fd_limit};
      if (::setrlimit(RLIMIT_NOFILE, &rl) != 0) _exit(126);
    }
    if (out_fd >= 0) {
      ::dup2(out_fd, 2);
    }
    std::vector<std::string> full{BinaryPath("membrokerd")};
    full.insert(full.end(), args.begin(), args.end());
    if (ready_write >= 0) {
      if (ready_write == 3)
        ::fcntl(3, F_SETFD, 0);  // dup2 onto itself would keep close-on-exec
      else
        ::dup2(ready_write, 3);
      full.push_back("--ready-fd");
      full.push_back("3");
    }
    std::vector<char*> argv;
    for (auto& a : full) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace

std::string BinaryPath(const char* name) {
  // A build folder carried to another machine (scripts/device-check) says where it is now.
  const char* moved = std::getenv("MEMBROKER_BIN_DIR");
  std::string dir = moved != nullptr && *moved != '\0' ? moved : MEMBROKER_BIN_DIR;
  if (!std::strcmp(name, "membrokerd")) return dir + "/broker/membrokerd";
  if (!std::strcmp(name, "membrokerctl") || !std::strcmp(name, "membroker-share")) return dir + "/tools/" + name;
  if (!std::strcmp(name, "net_module_probe") || !std::strcmp(name, "engine_agent") || !std::strcmp(name, "device_peer"))
    return dir + "/tests/" + name;
  return dir + "/examples/" + name;
}

BrokerProcess::BrokerProcess(std::vector<std::string> extra_args, bool log_to_file, uint64_t fd_limit,
                             const std::string& cgroup_procs) {
  char tmpl[] = "/tmp/membroker-test.XXXXXX";
  char* d = ::mkdtemp(tmpl);
  if (d == nullptr) std::abort();
  dir_ = d;
  ::chmod(d, 0755);  // other uids may reach the sockets; their own modes decide
  socket_ = dir_ + "/broker.sock";
  admin_ = socket_ + ".admin";  // the default: the broker and membrokerctl --socket find it there
  args_ = {"--socket", socket_};
  args_.insert(args_.end(), extra_args.begin(), extra_args.end());
  log_to_file_ = log_to_file;
  fd_limit_ = fd_limit;
  cgroup_procs_ = cgroup_procs;
  Start();
}

void BrokerProcess::Kill() {
  if (pid_ <= 0) return;
  ::kill(pid_, SIGKILL);
  (void)WaitChild(pid_);
  pid_ = -1;
}

void BrokerProcess::Restart() {
  if (pid_ > 0) std::abort();  // Kill or Stop it first
  Start();
}

int BrokerProcess::TakeOver(std::optional<std::vector<std::string>> extra_args) {
  const pid_t old = pid_;
  if (extra_args) {  // the new broker's own flags, kept for its restarts
    args_ = {"--socket", socket_};
    args_.insert(args_.end(), extra_args->begin(), extra_args->end());
  }
  const std::vector<std::string> args = args_;
  args_.push_back("--take-over");
  Start();
  args_ = args;
  return WaitChild(old);
}

void BrokerProcess::Start() {
  int ready[2];
  if (::pipe2(ready, O_CLOEXEC) != 0) std::abort();
  int log_fd = -1;
  if (log_to_file_) {
    log_fd = ::open(log_path().c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (log_fd < 0) std::abort();
  }
  pid_ = SpawnBroker(args_, ready[1], log_fd, fd_limit_, cgroup_procs_);
  ::close(ready[1]);
  if (log_fd >= 0) ::close(log_fd);
  std::string line;
  const bool ended = ReadAllFromFd(ready[0], &line);  // "READY <pid>\n", then the broker closes it
  ::close(ready[0]);
  if (!ended || line.rfind("READY ", 0) != 0) {
    ADD_FAILURE() << "membrokerd did not become ready " << (ended ? "" : "in 100 s ") << "(got '" << line << "')";
    ::kill(pid_, SIGKILL);
    std::abort();
  }
}

BrokerProcess::~BrokerProcess() {
  // A clean exit code also means no sanitizer or leak report from the broker.
  if (pid_ > 0) {
    // Whatever the test did, the broker's tables must still agree.
    EXPECT_EQ(Admin("check"), "tables: consistent\n") << "the broker's consistency check failed";
    EXPECT_EQ(Stop(), 0) << "membrokerd did not stop cleanly; see its stderr above";
  }
  std::string cmd = "rm -rf '" + dir_ + "'";
  (void)!std::system(cmd.c_str());
}

int BrokerProcess::Stop() {
  if (pid_ <= 0) return -1;
  ::kill(pid_, SIGTERM);
  int code = WaitChild(pid_);
  pid_ = -1;
  return code;
}

std::string BrokerProcess::Admin(const std::string& command) const {
  auto reply = ipc::AskAdmin(admin_, command);
  return reply.ok() ? *reply : "";
}

namespace {
// One field of a stats --json answer, or nothing (no answer, no such field).
std::optional<uint64_t> StatIn(const std::string& json, const std::string& key) {
  std::string needle = "\"" + key + "\": ";
  size_t at = json.find(needle);
  if (at == std::string::npos) return std::nullopt;
  return std::strtoull(json.c_str() + at + needle.size(), nullptr, 10);
}
}  // namespace

uint64_t BrokerProcess::Stat(const std::string& key) const {
  std::string json = Admin("stats --json");
  std::optional<uint64_t> v = StatIn(json, key);
  if (!v) {
    ADD_FAILURE() << "no stat '" << key << "' in " << json;
    return UINT64_MAX;
  }
  return *v;
}

uint64_t BrokerProcess::WaitForStat(const std::string& key, uint64_t value) const {
  // The broker learns of a peer's death from its event loop; an admin request
  // may be served first. Poll with a deadline instead of sleeping blindly.
  // A broker out of fds may turn the admin connection away meanwhile: that
  // is "not yet" too, until the deadline.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  std::optional<uint64_t> v = StatIn(Admin("stats --json"), key);
  while (v != value && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    v = StatIn(Admin("stats --json"), key);
  }
  if (!v) return Stat(key);  // reports the failure
  return *v;
}

size_t BrokerProcess::FdCount() const {
  std::string path = "/proc/" + std::to_string(pid_) + "/fd";
  size_t n = 0;
  if (DIR* d = ::opendir(path.c_str())) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

namespace {
// A child started with its output on out[1]: everything it writes, then its exit code.
RunResult Collect(pid_t pid, int out[2]) {
  ::close(out[1]);
  RunResult r;
  if (!ReadAllFromFd(out[0], &r.output)) {
    ADD_FAILURE() << "process " << pid << " still wrote or held its output open after 100 s; killed";
    ::kill(pid, SIGKILL);
  }
  ::close(out[0]);
  r.exit_code = WaitChild(pid);
  return r;
}
}  // namespace

RunResult RunBrokerExpectingExit(const std::vector<std::string>& args) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) std::abort();
  return Collect(SpawnBroker(args, -1, out[1]), out);
}

RunResult RunProgram(const std::vector<std::string>& args) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) std::abort();
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    std::vector<std::string> copy = args;
    std::vector<char*> argv;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    _exit(127);
  }
  return Collect(pid, out);
}

pid_t ForkChild(const std::function<int()>& fn) {
  std::fflush(nullptr);
  pid_t pid = ::fork();
  if (pid == 0) _exit(fn());
  return pid;
}

int WaitChild(pid_t pid) {
  // Bounded: a child stuck for 100 s (far past anything a test asks of one,
  // however loaded the machine) is killed and reported, so the test fails
  // with its name rather than by ctest's timeout.
  int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd >= 0) {
    pollfd p{pidfd, POLLIN, 0};
    int ready;
    do ready = ::poll(&p, 1, 100'000);
    while (ready < 0 && errno == EINTR);
    ::close(pidfd);
    if (ready == 0) {
      ADD_FAILURE() << "child " << pid << " did not end within 100 s; killed";
      ::kill(pid, SIGKILL);
    }
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) return -1;
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return -1;
}

Channel::Channel() {
  if (::pipe2(to_child_, O_CLOEXEC) != 0 || ::pipe2(to_parent_, O_CLOEXEC) != 0) std::abort();
}
Channel::~Channel() {
  for (int fd : {to_child_[0], to_child_[1], to_parent_[0], to_parent_[1]})
    if (fd >= 0) ::close(fd);
}
void Channel::AsChild() {
  child_ = true;
  ::close(to_child_[1]);
  ::close(to_parent_[0]);
  to_child_[1] = to_parent_[0] = -1;
}
void Channel::AsParent() {
  ::close(to_child_[0]);
  ::close(to_parent_[1]);
  to_child_[0] = to_parent_[1] = -1;
}
void Channel::Send(const std::string& line) {
  std::string l = line + "\n";
  (void)!::write(child_ ? to_parent_[1] : to_child_[1], l.data(), l.size());
}
std::string Channel::Receive() {
  int fd = child_ ? to_child_[0] : to_parent_[0];
  std::string out;
  char c;
  for (;;) {
    // Bounded: a peer that died leaves its end open in its siblings (forked
    // with every channel), so EOF alone might never come.
    pollfd p{fd, POLLIN, 0};
    int ready = ::poll(&p, 1, 60'000);
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) break;
    ssize_t n = ::read(fd, &c, 1);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0 || c == '\n') break;
    out.push_back(c);
  }
  return out;
}

}  // namespace membroker::testing
