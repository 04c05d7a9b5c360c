#include "keeper/keeper.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <utility>

#include "keeper/notify_message.h"
#include "log.h"
#include "membroker/ipc/unique_fd.h"

extern char** environ;

namespace membroker::broker::keeper {
namespace {

using Clock = std::chrono::steady_clock;
using ipc::UniqueFd;

// Restarts after a crash wait kFirstBackoff, doubling while the broker keeps
// crashing, up to kMaxBackoff; a broker that ran kStableRun before it died
// starts the series again.
constexpr std::chrono::milliseconds kFirstBackoff{100};
constexpr std::chrono::milliseconds kMaxBackoff{10'000};
constexpr std::chrono::seconds kStableRun{60};
// A broker told to stop that has not exited by then is killed.
constexpr std::chrono::seconds kStopTimeout{60};
// fds one datagram may carry (the broker sends one per FDSTORE=1).
constexpr size_t kMaxFdsPerMessage = 16;
// The kernel's limit on one environment string (MAX_ARG_STRLEN, 32 pages).
constexpr size_t kMaxEnvironmentString = 32 * 4096;

std::string Errno(const char* what) { return std::string(what) + ": " + std::strerror(errno); }
bool Fail(const char* what) {
  MB_ERROR("keeper_failed", "reason=\"%s\"", LogText(Errno(what)).c_str());
  return false;
}

// What systemd's fd store holds for a unit: fds by name, in the order stored.
class FdStore {
 public:
  explicit FdStore(size_t max) : max_(max) {}
  // Keeps fd under name; false (the fd closed) when the store is full.
  bool Add(const std::string& name, UniqueFd fd) {
    if (entries_.size() >= max_) return false;
    entries_.emplace_back(name, std::move(fd));
    return true;
  }
  // Closes every fd stored under name; how many.
  size_t Remove(const std::string& name) {
    const auto it = std::remove_if(entries_.begin(), entries_.end(), [&](const auto& e) { return e.first == name; });
    const size_t n = static_cast<size_t>(entries_.end() - it);
    entries_.erase(it, entries_.end());
    return n;
  }
  void Clear() { entries_.clear(); }
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, UniqueFd>>& entries() const { return entries_; }

 private:
  size_t max_;
  std::vector<std::pair<std::string, UniqueFd>> entries_;
};

class Keeper {
 public:
  explicit Keeper(const KeeperOptions& o) : options_(o), store_(o.fd_store_max) {}
  int Run();

 private:
  bool Setup();
  bool StartBroker();
  void OnSignal();
  void OnBrokerExit(int status);
  void OnNotify();
  void Handle(const NotifyMessage& m, std::vector<UniqueFd> fds);
  void ArmTimer(std::chrono::milliseconds after);
  void TellReady(pid_t pid);

  KeeperOptions options_;
  FdStore store_;
  UniqueFd signals_, notify_, timer_, ready_;
  std::string notify_address_;  // "@..." for NOTIFY_SOCKET
  pid_t broker_ = 0;            // running, or 0
  Clock::time_point started_at_;
  bool ever_ready_ = false;
  bool stopping_ = false;
  bool restart_due_ = false;  // the timer runs for a restart (else for a stop's deadline)
  std::chrono::milliseconds backoff_{0};
  int exit_code_ = -1;  // set: Run returns it
  uint64_t foreign_ = 0;
  uint64_t refused_ = 0;
};

bool Keeper::Setup() {
  sigset_t set;
  sigemptyset(&set);
  for (int s : {SIGCHLD, SIGTERM, SIGINT}) sigaddset(&set, s);
  // Blocked and read from a signalfd: also as PID 1, where a signal without a
  // handler would be dropped.
  if (::sigprocmask(SIG_BLOCK, &set, nullptr) != 0) return Fail("sigprocmask");
  signals_.reset(::signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK));
  if (!signals_) return Fail("signalfd");
  ::signal(SIGPIPE, SIG_IGN);
  ::signal(SIGHUP, SIG_IGN);  // a closed terminal does not stop the keeper, nor (not forwarded) the broker

  timer_.reset(::timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK));
  if (!timer_) return Fail("timerfd_create");

  // An abstract address no file can shadow; a datagram counts only when the
  // kernel says the broker this keeper started sent it (SO_PASSCRED).
  notify_.reset(::socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!notify_) return Fail("socket");
  const int one = 1;
  if (::setsockopt(notify_.get(), SOL_SOCKET, SO_PASSCRED, &one, sizeof(one)) != 0) return Fail("SO_PASSCRED");
  uint64_t nonce = 0;
  if (::getrandom(&nonce, sizeof(nonce), 0) != sizeof(nonce)) return Fail("getrandom");
  char name[64];
  std::snprintf(name, sizeof(name), "membrokerd-keeper/%d/%016llx", static_cast<int>(::getpid()),
                static_cast<unsigned long long>(nonce));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path + 1, name, std::strlen(name));
  const socklen_t len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + std::strlen(name));
  if (::bind(notify_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return Fail("bind");
  notify_address_ = std::string("@") + name;

  if (options_.ready_fd >= 0) {
    ready_.reset(options_.ready_fd);
    (void)::fcntl(ready_.get(), F_SETFD, FD_CLOEXEC);  // the keeper's, not the broker's
    (void)::fcntl(ready_.get(), F_SETFL, ::fcntl(ready_.get(), F_GETFL) | O_NONBLOCK);
  }
  return true;
}

bool Keeper::StartBroker() {
  // Everything the child needs is made here; the child only moves fds and execs.
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string_view v(*e);
    if (v.starts_with("NOTIFY_SOCKET=") || v.starts_with("LISTEN_") || v.starts_with("FDSTORE=") ||
        v.starts_with("WATCHDOG_"))
      continue;
    env.emplace_back(v);
  }
  env.push_back("NOTIFY_SOCKET=" + notify_address_);
  env.push_back("FDSTORE=" + std::to_string(options_.fd_store_max));
  std::string names;
  for (const auto& [name, fd] : store_.entries()) names += (names.empty() ? "" : ":") + name;
  if (names.size() + 16 > kMaxEnvironmentString) {
    // execve refuses a longer string (E2BIG): the broker would never start.
    // It starts without the store instead; clients bring back what they hold.
    MB_ERROR("fd_store_dropped",
             "stored_fds=%zu names_bytes=%zu reason=\"LISTEN_FDNAMES would pass the kernel's %zu-byte limit on one "
             "environment string\"",
             store_.size(), names.size(), kMaxEnvironmentString);
    store_.Clear();
    names.clear();
  }
  const size_t n = store_.size();
  if (n > 0) {
    env.push_back("LISTEN_FDS=" + std::to_string(n));
    env.push_back("LISTEN_FDNAMES=" + names);
  }
  std::vector<char*> envp, argv;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);  // LISTEN_PID goes here in the child
  envp.push_back(nullptr);
  std::vector<std::string> args = options_.broker_args;
  args.insert(args.begin(), options_.broker_path);
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<int> fds;
  for (const auto& [name, fd] : store_.entries()) fds.push_back(fd.get());

  const pid_t pid = ::fork();
  if (pid < 0) {
    MB_ERROR("broker_start_failed", "reason=\"%s\"", LogText(Errno("fork")).c_str());
    return false;
  }
  if (pid == 0) {
    sigset_t none;
    sigemptyset(&none);
    ::sigprocmask(SIG_SETMASK, &none, nullptr);
    ::signal(SIGPIPE, SIG_DFL);
    ::signal(SIGHUP, SIG_DFL);
    // The stored fds become 3, 4, ... (as systemd passes them): first moved
    // above that range, so that no dup2 overwrites one not yet moved.
    for (int& fd : fds)
      if ((fd = ::fcntl(fd, F_DUPFD_CLOEXEC, static_cast<int>(3 + n))) < 0) ::_exit(126);
    for (size_t i = 0; i < n; ++i)
      if (::dup2(fds[i], static_cast<int>(3 + i)) < 0) ::_exit(126);
    char listen_pid[32];
    std::snprintf(listen_pid, sizeof(listen_pid), "LISTEN_PID=%d", static_cast<int>(::getpid()));
    if (n > 0) envp[envp.size() - 2] = listen_pid;
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  broker_ = pid;
  started_at_ = Clock::now();
  MB_INFO("broker_started", "pid=%d stored_fds=%zu", static_cast<int>(pid), n);
  return true;
}

void Keeper::ArmTimer(std::chrono::milliseconds after) {
  itimerspec t{};
  const auto ms = std::max<int64_t>(after.count(), 1);
  t.it_value.tv_sec = ms / 1000;
  t.it_value.tv_nsec = (ms % 1000) * 1'000'000;
  (void)::timerfd_settime(timer_.get(), 0, &t, nullptr);
}

void Keeper::TellReady(pid_t pid) {
  if (!ready_) return;
  char line[32];
  const int len = std::snprintf(line, sizeof(line), "READY %d\n", static_cast<int>(pid));
  // A reader that went away or does not read loses the line, never the keeper.
  if (::write(ready_.get(), line, static_cast<size_t>(len)) != len && errno != EAGAIN) ready_.reset();
}

void Keeper::OnSignal() {
  signalfd_siginfo si;
  while (::read(signals_.get(), &si, sizeof(si)) == sizeof(si)) {
    if (si.ssi_signo == SIGCHLD) {
      // Every child: the broker, and as PID 1 whatever was left to us.
      int status = 0;
      pid_t pid;
      while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0)
        if (pid == broker_) OnBrokerExit(status);
      continue;
    }
    MB_INFO("stopping", "signal=%u broker=%d", si.ssi_signo, static_cast<int>(broker_));
    stopping_ = true;
    if (broker_ == 0) {
      exit_code_ = 0;  // between a crash and its restart: nothing to stop
      return;
    }
    (void)::kill(broker_, SIGTERM);
    restart_due_ = false;
    ArmTimer(kStopTimeout);
  }
}

void Keeper::OnBrokerExit(int status) {
  const pid_t pid = std::exchange(broker_, 0);
  const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  const auto ran = Clock::now() - started_at_;
  if (stopping_ || (WIFEXITED(status) && code == 0)) {
    // Stopped, by us or by itself: the store goes, as systemd's does when a unit stops.
    MB_INFO("broker_exited", "pid=%d code=%d", static_cast<int>(pid), code);
    store_.Clear();
    exit_code_ = code;
    return;
  }
  if (!ever_ready_) {
    MB_ERROR("broker_never_ready", "pid=%d code=%d reason=\"not restarting a broker that never became ready\"",
             static_cast<int>(pid), code);
    exit_code_ = code == 0 ? 1 : code;
    return;
  }
  backoff_ = ran >= kStableRun || backoff_.count() == 0 ? kFirstBackoff : std::min(backoff_ * 2, kMaxBackoff);
  MB_WARN("broker_died", "pid=%d %s=%d stored_fds=%zu restart_in_ms=%lld", static_cast<int>(pid),
          WIFEXITED(status) ? "code" : "signal", WIFEXITED(status) ? code : WTERMSIG(status), store_.size(),
          static_cast<long long>(backoff_.count()));
  restart_due_ = true;
  ArmTimer(backoff_);
}

void Keeper::OnNotify() {
  for (;;) {
    char buf[kMaxNotifyBytes + 1];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(ucred)) + CMSG_SPACE(sizeof(int) * kMaxFdsPerMessage)];
    iovec iov{buf, sizeof(buf)};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    const ssize_t got = ::recvmsg(notify_.get(), &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC | MSG_TRUNC);
    if (got < 0) return;        // EAGAIN: drained (nothing else fails on a bound datagram socket)
    std::vector<UniqueFd> fds;  // owned first, so every path below closes them
    pid_t sender = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_RIGHTS) {
        const size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < count; ++i) {
          int fd;
          std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
          fds.emplace_back(fd);
        }
      } else if (c->cmsg_type == SCM_CREDENTIALS) {
        ucred cred;
        std::memcpy(&cred, CMSG_DATA(c), sizeof(cred));
        sender = cred.pid;
      }
    }
    if (broker_ == 0 || sender != broker_) {
      // Anyone in this network namespace can reach an abstract address.
      if (foreign_++ % 1000 == 0)
        MB_WARN("notify_ignored", "from_pid=%d fds=%zu count=%llu reason=\"not the broker this keeper started\"",
                static_cast<int>(sender), fds.size(), static_cast<unsigned long long>(foreign_));
      continue;
    }
    if ((msg.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) != 0) {
      MB_WARN("notify_ignored", "from_pid=%d bytes=%zd reason=\"truncated: more than %zu bytes or %zu fds\"",
              static_cast<int>(sender), got, kMaxNotifyBytes, kMaxFdsPerMessage);
      continue;
    }
    std::string error;
    const auto m = ParseNotifyMessage(std::string_view(buf, static_cast<size_t>(got)), &error);
    if (!m) {
      MB_WARN("notify_ignored", "from_pid=%d reason=\"%s\"", static_cast<int>(sender), LogText(error).c_str());
      continue;
    }
    Handle(*m, std::move(fds));
  }
}

void Keeper::Handle(const NotifyMessage& m, std::vector<UniqueFd> fds) {
  if (m.fd_store) {
    for (auto& fd : fds)
      if (!store_.Add(m.fd_name, std::move(fd)) && refused_++ % 1000 == 0)
        MB_WARN("fd_store_full", "name=\"%s\" max=%zu refused=%llu", LogText(m.fd_name).c_str(), options_.fd_store_max,
                static_cast<unsigned long long>(refused_));
  } else if (m.fd_store_remove) {
    store_.Remove(m.fd_name);
  }
  // fds that came without FDSTORE=1 close here, as systemd closes them.
  if (m.ready) {
    const bool first = !ever_ready_;
    ever_ready_ = true;
    MB_INFO("broker_ready", "pid=%d stored_fds=%zu%s", static_cast<int>(broker_), store_.size(),
            first ? "" : " restarted=yes");
    TellReady(broker_);
  }
}

int Keeper::Run() {
  if (!Setup() || !StartBroker()) return 1;
  while (exit_code_ < 0) {
    pollfd p[3] = {{signals_.get(), POLLIN, 0}, {notify_.get(), POLLIN, 0}, {timer_.get(), POLLIN, 0}};
    if (::poll(p, 3, -1) < 0) {  // unbounded by design: the keeper waits for its broker's life
      if (errno == EINTR) continue;
      MB_ERROR("keeper_failed", "reason=\"%s\"", LogText(Errno("poll")).c_str());
      return 1;
    }
    if (p[1].revents & POLLIN) OnNotify();  // before a SIGCHLD: what a dying broker stored counts
    if (p[0].revents & POLLIN) OnSignal();
    if (exit_code_ >= 0) break;
    if (p[2].revents & POLLIN) {
      uint64_t expirations;
      // Nothing read: the timer has not expired after all (it was re-armed).
      if (::read(timer_.get(), &expirations, sizeof(expirations)) != sizeof(expirations)) continue;
      if (restart_due_ && broker_ == 0 && !stopping_) {
        restart_due_ = false;
        if (!StartBroker()) ArmTimer(kMaxBackoff);  // fork failed: try again later
      } else if (stopping_ && broker_ != 0) {
        MB_WARN("broker_stop_timeout", "pid=%d killed_after_s=%lld", static_cast<int>(broker_),
                static_cast<long long>(kStopTimeout.count()));
        (void)::kill(broker_, SIGKILL);
      }
    }
  }
  MB_INFO("keeper_exit", "code=%d", exit_code_);
  return exit_code_;
}

}  // namespace

bool SplitSuperviseArgs(int argc, char** argv, KeeperOptions* keeper, std::string* error) {
  keeper->broker_args.clear();
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--supervise") continue;
    if (a == "--ready-fd") {
      char* end = nullptr;
      const long fd = i + 1 < argc ? std::strtol(argv[i + 1], &end, 10) : -1;
      if (fd < 0 || fd > 1'000'000 || end == nullptr || *end != '\0' || end == argv[i + 1]) {
        *error = "--ready-fd needs a file descriptor number";
        return false;
      }
      keeper->ready_fd = static_cast<int>(fd);
      ++i;
      continue;
    }
    keeper->broker_args.push_back(a);
  }
  return true;
}

int RunKeeper(const KeeperOptions& options) {
  g_log_program = "membrokerd-keeper";
  Keeper k(options);
  return k.Run();
}

}  // namespace membroker::broker::keeper
