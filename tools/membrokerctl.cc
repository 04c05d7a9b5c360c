// membrokerctl: talks to membrokerd's admin socket.
//   membrokerctl --admin-socket PATH [--json] stats | list clients | list allocations
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace {
const char kUsage[] =
    "usage: membrokerctl --admin-socket PATH [--json] COMMAND\n"
    "commands:\n"
    "  stats              counters: clients, allocations, bytes, cleanups\n"
    "  list clients       connected clients (pid, uid, name, holdings, bytes held)\n"
    "  list allocations   live allocations (size, page size, owner, holders, pinned)\n"
    "  list pools         pre-created pools: capacity, ready, hits, misses, refills\n"
    "  list quotas        usage and limits per uid and per client\n";
}

int main(int argc, char** argv) {
  std::string admin, command;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--admin-socket" && i + 1 < argc) {
      admin = argv[++i];
    } else if (a == "--json") {
      json = true;
    } else if (a == "--help" || a == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    } else {
      command += (command.empty() ? "" : " ") + a;
    }
  }
  if (admin.empty() || command.empty()) {
    std::fputs(kUsage, stderr);
    return 2;
  }
  sockaddr_un addr{};
  if (admin.size() >= sizeof(addr.sun_path)) {
    std::fprintf(stderr, "membrokerctl: admin socket path too long\n");
    return 2;
  }
  addr.sun_family = AF_UNIX;
  std::memcpy(addr.sun_path, admin.c_str(), admin.size() + 1);
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::fprintf(stderr, "membrokerctl: cannot connect to %s: %s\n", admin.c_str(),
                 std::strerror(errno));
    return 1;
  }
  std::string line = command + (json ? " --json" : "") + "\n";
  if (::write(fd, line.data(), line.size()) != static_cast<ssize_t>(line.size())) {
    std::fprintf(stderr, "membrokerctl: write: %s\n", std::strerror(errno));
    return 1;
  }
  std::string reply;
  char buf[65536];
  for (;;) {
    ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  std::fputs(reply.c_str(), stdout);
  bool failed = reply.rfind("error:", 0) == 0 || reply.rfind("{\"error\"", 0) == 0;
  return failed ? 1 : 0;
}
