// A process that uses a transfer engine on its host only, then asks for the
// network: it prints whether UCX (libucs) and the network module are mapped
// before and after, for NetModule.LoadedOnlyWhenAnEngineAsksForTheNetwork.
//   net_module_probe SOCKET SECRET_FILE
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>

#include "membroker/client.h"
#include "membroker/transfer_engine.h"

using namespace membroker;

namespace {
bool Mapped(const char* what) {
  std::ifstream maps("/proc/self/maps");
  std::stringstream all;
  all << maps.rdbuf();
  return all.str().find(what) != std::string::npos;
}

void Report(const char* when) {
  std::printf("%s libucs=%d module=%d\n", when, Mapped("libucs") ? 1 : 0, Mapped("libmembroker-ucx") ? 1 : 0);
  std::fflush(stdout);
}
}  // namespace

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  Report("start");
  auto a = Client::Connect({argv[1], "probe-local"});
  auto b = Client::Connect({argv[1], "probe-peer"});
  auto c = Client::Connect({argv[1], "probe-net"});  // a client runs one engine
  if (!a.ok() || !b.ok() || !c.ok()) return 3;
  // A same-host engine, a registered range and a transfer engine connected by name: no network.
  TransferEngine local(*a), peer(*b);
  if (!local.Initialize("probe-local").ok() || !peer.Initialize("probe-peer").ok()) return 4;
  auto mem = a->MallocHost(1 << 16);
  MemHandle h{};
  if (!mem.ok() || !local.RegisterMem({reinterpret_cast<uintptr_t>(*mem), 1 << 16}, MEM_HOST, h).ok()) return 5;
  if (!peer.Connect("probe-local", 5000).ok()) return 6;
  Report("same_host");
  // Now the network: a listener.
  TransferEngine net(*c);
  Status st = net.Initialize("probe-listener", {{"listen_address", "127.0.0.1:0"}, {"secret_file", argv[2]}});
  std::printf("network %s\n", st.ok() ? "ok" : std::string(ErrorCodeName(st.code())).c_str());
  Report("network");
  (void)peer.Disconnect("probe-local", 5000);
  (void)local.DeregisterMem(h);
  (void)a->FreeHost(*mem);
  return 0;
}
