// membrokerd: the membroker daemon.
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "broker.h"
#include "keeper/keeper.h"
#include "log.h"
#include "options.h"
#include "restart/systemd.h"

namespace {

// Grows the fd table to hold `slots` fds now, while the broker has one thread.
// Once it has worker threads, each doubling of the table waits for an RCU
// grace period (milliseconds here) inside whatever call needed the slot: a
// recvmsg taking a reattaching client's fds stalled the loop ~10 ms a time.
void PresizeFdTable(rlim_t slots) {
  if (slots < 2) return;
  const int high = ::fcntl(0, F_DUPFD_CLOEXEC, static_cast<int>(slots - 1));
  if (high >= 0) ::close(high);
}

}  // namespace

int main(int argc, char** argv) {
  using namespace membroker::broker;
  Options opt;
  bool help = false;
  membroker::Status parsed = ParseArgs(argc, argv, &opt, &help);
  if (help) {
    std::fputs(kUsage, stdout);
    return 0;
  }
  if (!parsed.ok()) {
    std::fprintf(stderr, "membrokerd: %s\n%s", parsed.message().c_str(), kUsage);
    return 2;
  }

  // fds 0-2 open (on /dev/null if they came closed), so no socket the broker
  // accepts ever takes one of their numbers.
  for (int fd = 0; fd <= 2; ++fd)
    if (::fcntl(fd, F_GETFD) < 0 && ::open("/dev/null", O_RDWR) != fd) return 1;
  ::signal(SIGPIPE, SIG_IGN);
  // One fd per allocation: use the whole hard limit.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }

  g_log_json = opt.log_json;  // the keeper's lines too
  g_log_level = opt.log_level;
  if (opt.supervise) {
    // The keeper runs no broker code: it starts this binary again without
    // --supervise (keeper/keeper.h).
    if (!systemd::Available()) {
      std::fprintf(stderr,
                   "membrokerd: --supervise needs a build with libsystemd (the broker stores its memory "
                   "through sd_notify's fd store protocol)\n");
      return 2;
    }
    keeper::KeeperOptions k;
    std::string error;
    if (!keeper::SplitSuperviseArgs(argc, argv, &k, &error)) {
      std::fprintf(stderr, "membrokerd: %s\n", error.c_str());
      return 2;
    }
    char self[PATH_MAX];
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n <= 0) {
      std::fprintf(stderr, "membrokerd: --supervise: cannot read /proc/self/exe: %s\n", std::strerror(errno));
      return 1;
    }
    k.broker_path.assign(self, static_cast<size_t>(n));
    // The broker's own options must not name a ready fd (a --config file's
    // ready-fd): under the keeper, fds from 3 up are the stored memory.
    std::vector<char*> child_argv{argv[0]};
    for (std::string& a : k.broker_args) child_argv.push_back(a.data());
    Options child;
    bool child_help = false;
    if (ParseArgs(static_cast<int>(child_argv.size()), child_argv.data(), &child, &child_help).ok() &&
        child.ready_fd >= 0) {
      std::fprintf(stderr,
                   "membrokerd: --supervise: ready-fd in a config file would reach the broker, whose fds "
                   "from 3 up are its stored memory; give --ready-fd on the command line instead\n");
      return 2;
    }
    return keeper::RunKeeper(k);
  }

  rlimit fds{};
  if (::getrlimit(RLIMIT_NOFILE, &fds) == 0) PresizeFdTable(std::min<rlim_t>(fds.rlim_cur, 65536));
  auto broker = Broker::Create(opt);
  if (!broker.ok()) {
    std::fprintf(stderr, "membrokerd: cannot start: %s\n", broker.status().ToString().c_str());
    return 1;
  }
  membroker::Status st = (*broker)->Run();
  if (!st.ok()) {
    std::fprintf(stderr, "membrokerd: %s\n", st.ToString().c_str());
    return 1;
  }
  return 0;
}
