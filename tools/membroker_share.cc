// membroker-share: serves this host's names published read-only for the
// cluster to FetchNamed on other hosts (membroker/name_share.h,
// docs/CLUSTER.md). One per host, beside membrokerd; runs until SIGTERM/SIGINT.
//   membroker-share [--socket PATH] --listen IP:PORT (--secret-file FILE | --allow-from LIST)
// Prints "serving as ENGINE on ADDRESS" on stdout once it serves.

#include <signal.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>

#include "membroker/client.h"
#include "membroker/ipc/escape.h"
#include "membroker/name_share.h"

namespace {

std::atomic<bool> g_stop{false};
void OnSignal(int) { g_stop = true; }

constexpr char kUnitSocket[] = "/run/membroker/membroker.sock";  // packaging/membrokerd.service

void Usage(FILE* out) {
  std::fputs(
      "usage: membroker-share [--socket PATH] --listen IP:PORT (--secret-file FILE | --allow-from LIST)\n"
      "Serves this host's names published read-only for the cluster (publish with the cluster and\n"
      "read-only flags) to FetchNamed on other hosts, through a transfer engine listening on IP:PORT\n"
      "as membroker-share@HOST. The broker must run with --cluster. Connectors must present the\n"
      "secret in FILE (mode 0600 or stricter) or come from an address in LIST (\"10.0.0.0/24,fd00::7\").\n"
      "--socket: the broker's socket; else $MEMBROKER_SOCKET, else /run/membroker/membroker.sock.\n",
      out);
}

int Fail(const char* what, const membroker::Status& st) {
  std::fprintf(stderr, "membroker-share: %s: %s\n", what, membroker::ipc::EscapeText(st.ToString()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  std::map<std::string, std::string> options;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      Usage(stdout);
      return 0;
    }
    if (i + 1 >= argc) {
      Usage(stderr);
      return 2;
    }
    const std::string value = argv[++i];
    if (arg == "--socket") socket = value;
    else if (arg == "--listen") options["listen_address"] = value;
    else if (arg == "--secret-file") options["secret_file"] = value;
    else if (arg == "--allow-from") options["allow_from"] = value;
    else {
      std::fprintf(stderr, "membroker-share: unknown option %s\n", membroker::ipc::EscapeText(arg).c_str());
      Usage(stderr);
      return 2;
    }
  }
  if (options.count("listen_address") == 0) {
    std::fprintf(stderr, "membroker-share: --listen IP:PORT is required\n");
    return 2;
  }
  if (socket.empty()) {
    const char* env = std::getenv("MEMBROKER_SOCKET");
    socket = env != nullptr && *env != '\0' ? env : kUnitSocket;
  }
  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);

  auto client = membroker::Client::Connect({socket, "membroker-share"});
  if (!client.ok()) return Fail("cannot connect to the broker", client.status());
  auto share = membroker::NameShare::Start(*client, options);
  if (!share.ok()) return Fail("cannot start", share.status());
  for (const std::string& problem : (*share)->TakeProblems())
    std::fprintf(stderr, "membroker-share: %s\n", membroker::ipc::EscapeText(problem).c_str());
  membroker::NetworkStats ns;
  (void)(*share)->engine().GetNetworkStats(ns);
  std::printf("serving as %s on %s\n",
              membroker::ipc::EscapeText(membroker::NameShare::EngineName(client->cluster_host())).c_str(),
              ns.listen_address.c_str());
  std::fflush(stdout);
  while (!g_stop) {
    membroker::Status st = (*share)->Serve(200);
    for (const std::string& problem : (*share)->TakeProblems())
      std::fprintf(stderr, "membroker-share: %s\n", membroker::ipc::EscapeText(problem).c_str());
    // A broker restart: the client reattaches by itself; calls fail until it has.
    if (!st.ok() && st.code() != membroker::ErrorCode::kNotConnected) return Fail("serving", st);
  }
  return 0;
}
