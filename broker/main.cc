// membrokerd: the membroker daemon.
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "broker.h"

namespace {

const char kUsage[] =
    "usage: membrokerd --socket PATH [options]\n"
    "  --socket PATH         client socket (SOCK_SEQPACKET, mode 0660)\n"
    "  --admin-socket PATH   admin socket (mode 0600); default: PATH.admin\n"
    "  --ready-fd N          write \"READY <pid>\\n\" to fd N once serving, then close it\n"
    "  --max-bytes SIZE      byte budget for all allocations (suffix K, M, G); default: half of RAM\n"
    "  --max-clients N       clients connected at once (default 1024)\n"
    "  --verbose             log every connection and error reply\n";

bool ParseSize(const char* s, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s, &end, 10);
  if (errno != 0 || end == s) return false;
  uint64_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ull << 10, ++end;
  else if (*end == 'M' || *end == 'm') mult = 1ull << 20, ++end;
  else if (*end == 'G' || *end == 'g') mult = 1ull << 30, ++end;
  if (*end != '\0') return false;
  *out = v * mult;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  membroker::broker::Options opt;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "membrokerd: %s needs a value\n%s", a.c_str(), kUsage);
        std::exit(2);
      }
      return argv[++i];
    };
    uint64_t n = 0;
    if (a == "--socket") {
      opt.socket_path = next();
    } else if (a == "--admin-socket") {
      opt.admin_socket_path = next();
    } else if (a == "--ready-fd" && ParseSize(next(), &n)) {
      opt.ready_fd = static_cast<int>(n);
    } else if (a == "--max-bytes" && ParseSize(next(), &n) && n > 0) {
      opt.max_bytes = n;
    } else if (a == "--max-clients" && ParseSize(next(), &n) && n > 0) {
      opt.max_clients = n;
    } else if (a == "--verbose") {
      opt.verbose = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      std::fprintf(stderr, "membrokerd: bad argument '%s'\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  if (opt.socket_path.empty()) {
    std::fprintf(stderr, "membrokerd: --socket is required\n%s", kUsage);
    return 2;
  }
  if (opt.admin_socket_path.empty()) opt.admin_socket_path = opt.socket_path + ".admin";

  ::signal(SIGPIPE, SIG_IGN);
  // One fd per allocation: use the whole hard limit.
  rlimit rl{};
  if (::getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }

  auto broker = membroker::broker::Broker::Create(opt);
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
