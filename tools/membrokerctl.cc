// membrokerctl: talks to membrokerd's admin socket.
//   membrokerctl [--admin-socket PATH | --socket PATH] [--json] [--timeout-ms N] COMMAND [ARG]
// Without either flag: $MEMBROKER_ADMIN_SOCKET, then the shipped unit's
// /run/membroker/membroker.sock.admin.
// The commands, their arguments and their help come from the one table the
// broker dispatches on (membroker/ipc/admin_commands.h).

#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "membroker/ipc/admin_client.h"
#include "membroker/ipc/admin_commands.h"
#include "membroker/ipc/escape.h"
#include "top.h"

namespace {

using membroker::ipc::AdminUsage;
using membroker::ipc::EscapeText;

constexpr char kUnitAdminSocket[] = "/run/membroker/membroker.sock.admin";  // packaging/membrokerd.service

void Usage(FILE* out) {
  std::fputs(
      "usage: membrokerctl [--admin-socket PATH | --socket PATH] [--json] [--timeout-ms N] COMMAND [ARG]\n"
      "       membrokerctl COMMAND --help\n"
      "       membrokerctl top [--interval-ms N] [--once]   a live view (q quits)\n"
      "The admin socket: --admin-socket PATH; --socket PATH (a broker's client socket) means PATH.admin;\n"
      "else $MEMBROKER_ADMIN_SOCKET; else the shipped unit's /run/membroker/membroker.sock.admin.\n",
      out);
  std::fputs(membroker::ipc::AdminHelpText().c_str(), out);
}

// Without --admin-socket or --socket: $MEMBROKER_ADMIN_SOCKET, then the unit's.
std::string FindAdminSocket() {
  const char* from_env = std::getenv("MEMBROKER_ADMIN_SOCKET");
  if (from_env != nullptr && *from_env != '\0') return from_env;
  struct stat st {};
  return ::stat(kUnitAdminSocket, &st) == 0 ? kUnitAdminSocket : "";
}

int NoAdminSocket() {
  std::fprintf(stderr,
               "membrokerctl: no admin socket: give --admin-socket PATH or --socket PATH (a broker's client "
               "socket), or set MEMBROKER_ADMIN_SOCKET (%s does not exist)\n",
               kUnitAdminSocket);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  std::string admin;
  std::string line;
  bool help = false;
  long timeout_ms = 10000;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--admin-socket" && i + 1 < argc) {
      admin = argv[++i];
    } else if (a == "--socket" && i + 1 < argc) {
      admin = std::string(argv[++i]) + ".admin";
    } else if (a == "--timeout-ms" && i + 1 < argc) {
      char* end = nullptr;
      timeout_ms = std::strtol(argv[++i], &end, 10);
      if (*end != '\0' || timeout_ms <= 0) {
        std::fprintf(stderr, "membrokerctl: --timeout-ms needs a positive number\n");
        return 2;
      }
    } else if (a == "--help" || a == "-h") {
      help = true;
    } else {
      line += (line.empty() ? "" : " ") + a;  // --json travels with the command
    }
  }
  if (line.empty() || line == "help" || line == "--json") {
    if (help || line == "help") {
      Usage(stdout);
      return 0;
    }
    if (line.empty()) {
      Usage(stderr);
      return 2;
    }
  }
  if (help && (line == "top" || line.rfind("top ", 0) == 0)) {
    std::puts(
        "membrokerctl top [--interval-ms N] [--once]\n\n"
        "A live view of the broker, redrawn every N ms (default 1000): clients, memory by kind and by client\n"
        "(sorted by bytes held), request and error rates. q, Ctrl-C or the end of stdin quits; --once prints\n"
        "one frame without screen control.");
    return 0;
  }
  if (help) {  // "kick client --help": the command's words, with or without its argument
    const membroker::ipc::AdminCommand* found = membroker::ipc::FindAdminCommand(line);
    if (found == nullptr) {
      std::fprintf(stderr, "membrokerctl: unknown command '%s' (membrokerctl --help lists them)\n",
                   EscapeText(line).c_str());
      return 2;
    }
    const auto& c = *found;
    std::printf("membrokerctl --admin-socket PATH%s %s\n\n%.*s\n", c.has_json ? " [--json]" : "", AdminUsage(c).c_str(),
                static_cast<int>(c.details.size()), c.details.data());
    if (!c.columns.empty()) std::printf("\nColumns: %.*s\n", static_cast<int>(c.columns.size()), c.columns.data());
    return 0;
  }
  if (line == "top" || line.rfind("top ", 0) == 0) {  // the client's own command, not the broker's
    int interval_ms = 1000;
    bool once = false;
    std::vector<std::string> words;
    for (size_t at = 0, next; at < line.size(); at = next + 1) {
      next = line.find(' ', at);
      if (next == std::string::npos) next = line.size();
      words.push_back(line.substr(at, next - at));
    }
    for (size_t i = 1; i < words.size(); ++i) {
      if (words[i] == "--once") {
        once = true;
      } else if (words[i] == "--interval-ms" && i + 1 < words.size()) {
        interval_ms = std::atoi(words[++i].c_str());
        if (interval_ms < 50 || interval_ms > 3'600'000) {
          std::fprintf(stderr, "membrokerctl: top --interval-ms wants 50 to 3600000\n");
          return 2;
        }
      } else {
        std::fprintf(stderr, "membrokerctl: top takes --interval-ms N and --once, not '%s'\n",
                     EscapeText(words[i]).c_str());
        return 2;
      }
    }
    if (admin.empty()) admin = FindAdminSocket();
    if (admin.empty()) return NoAdminSocket();
    return membroker::ctl::RunTop(admin, interval_ms, once);
  }
  auto req = membroker::ipc::ParseAdminLine(line);
  if (!req.ok()) {
    std::fprintf(stderr, "membrokerctl: %s (membrokerctl --help lists the commands)\n",
                 EscapeText(req.status().message()).c_str());
    return 2;
  }
  if (admin.empty()) admin = FindAdminSocket();
  if (admin.empty()) return NoAdminSocket();
  auto answer = membroker::ipc::AskAdmin(admin, line, std::chrono::milliseconds(timeout_ms));
  if (!answer.ok()) {
    const std::string why = EscapeText(answer.status().message());
    if (answer.code() == membroker::ErrorCode::kParamInvalid) {  // the path cannot be a socket
      std::fprintf(stderr, "membrokerctl: %s\n", why.c_str());
      return 2;
    }
    if (answer.code() == membroker::ErrorCode::kProtocolError ||
        answer.code() == membroker::ErrorCode::kTimeout)  // connected, but no answer
      std::fprintf(stderr, "membrokerctl: %s\n", why.c_str());
    else
      std::fprintf(stderr, "membrokerctl: cannot connect to %s: %s\n", EscapeText(admin).c_str(), why.c_str());
    return 1;
  }
  const std::string& reply = *answer;
  bool failed = reply.rfind("error:", 0) == 0 || reply.rfind("{\"error\"", 0) == 0;
  std::fputs(reply.c_str(), failed ? stderr : stdout);
  return failed ? 1 : 0;
}
