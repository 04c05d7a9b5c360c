// membrokerctl: talks to membrokerd's admin socket.
//   membrokerctl --admin-socket PATH [--json] COMMAND [ARGS]

#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "membroker/ipc/admin_client.h"

namespace {

struct Command {
  const char* words;  // what the user types, without the ID argument
  const char* arg;    // "ID" or nullptr
  const char* help;
};

const Command kCommands[] = {
    {"stats", nullptr, "Counters and gauges: clients, allocations, bytes, pinned memory, cleanups."},
    {"metrics", nullptr, "The stats in the Prometheus text exposition format."},
    {"list clients", nullptr, "Connected clients: pid, uid, name, connected since, bytes held, "
                              "allocations, imports, pinned bytes."},
    {"list allocations", nullptr, "Live allocations: id, size, page size, pinned, owner, holders, "
                                  "exported, read-only, age."},
    {"list pools", nullptr, "Pools: size, capacity, ready, in use, hits, misses, refills."},
    {"list quotas", nullptr, "Usage and limits per uid and per client."},
    {"show client", "ID", "One client, with the ids of the allocations it holds."},
    {"show allocation", "ID", "One allocation, with the clients that hold it."},
    {"kick client", "ID", "Disconnect a client and release everything it held, exactly as if it "
                          "had crashed."},
    {"free allocation", "ID", "Stop exporting an allocation and drop every holder's broker "
                              "reference. Processes that mapped it keep their pages until they "
                              "unmap them or exit: the broker cannot revoke a mapping."},
    {"config", nullptr, "The broker's effective configuration."},
};

void Usage(FILE* out) {
  std::fputs("usage: membrokerctl --admin-socket PATH [--json] COMMAND [ID]\n"
             "       membrokerctl COMMAND --help\ncommands:\n", out);
  for (const Command& c : kCommands)
    std::fprintf(out, "  %-22s %.60s%s\n",
                 (std::string(c.words) + (c.arg ? std::string(" ") + c.arg : "")).c_str(), c.help,
                 std::strlen(c.help) > 60 ? "..." : "");
}

const Command* Find(const std::string& words) {
  for (const Command& c : kCommands)
    if (words == c.words) return &c;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  std::string admin;
  std::vector<std::string> words;
  bool json = false, help = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--admin-socket" && i + 1 < argc) admin = argv[++i];
    else if (a == "--json") json = true;
    else if (a == "--help" || a == "-h") help = true;
    else words.push_back(a);
  }
  // Split "show client 7" into the command and its argument.
  std::string arg;
  if (!words.empty() && !words.back().empty() && words.back().find_first_not_of("0123456789") == std::string::npos) {
    arg = words.back();
    words.pop_back();
  }
  std::string cmd;
  for (const auto& w : words) cmd += (cmd.empty() ? "" : " ") + w;
  if (cmd.empty() || cmd == "help") {
    Usage(help || cmd == "help" ? stdout : stderr);
    return help || cmd == "help" ? 0 : 2;
  }
  const Command* c = Find(cmd);
  if (c == nullptr) {
    std::fprintf(stderr, "membrokerctl: unknown command '%s' (membrokerctl --help lists them)\n", cmd.c_str());
    return 2;
  }
  if (help) {
    std::printf("membrokerctl --admin-socket PATH [--json] %s%s%s\n\n%s\n", c->words, c->arg ? " " : "",
                c->arg ? c->arg : "", c->help);
    return 0;
  }
  if ((c->arg != nullptr) != !arg.empty()) {
    std::fprintf(stderr, "membrokerctl: '%s' %s\n", c->words, c->arg ? "needs an ID" : "takes no argument");
    return 2;
  }
  if (admin.empty()) {
    std::fprintf(stderr, "membrokerctl: --admin-socket PATH is required\n");
    return 2;
  }
  std::string line = cmd + (arg.empty() ? "" : " " + arg) + (json ? " --json" : "");
  auto answer = membroker::ipc::AskAdmin(admin, line);
  if (!answer.ok()) {
    if (answer.code() == membroker::ErrorCode::kParamInvalid) {  // the path cannot be a socket
      std::fprintf(stderr, "membrokerctl: %s\n", answer.status().message().c_str());
      return 2;
    }
    if (answer.code() == membroker::ErrorCode::kProtocolError)  // connected, but no answer
      std::fprintf(stderr, "membrokerctl: %s\n", answer.status().message().c_str());
    else
      std::fprintf(stderr, "membrokerctl: cannot connect to %s: %s\n", admin.c_str(),
                   answer.status().message().c_str());
    return 1;
  }
  const std::string& reply = *answer;
  bool failed = reply.rfind("error:", 0) == 0 || reply.rfind("{\"error\"", 0) == 0;
  std::fputs(reply.c_str(), failed ? stderr : stdout);
  return failed ? 1 : 0;
}
