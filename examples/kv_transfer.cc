// KV-cache hand-off with the transfer engine, as between a prefill and a
// decode process: decode registers broker memory for N blocks; prefill
// computes the blocks, writes them into decode's memory with one TransferSync
// (one descriptor per block) and notifies decode, which checks every block.
//   kv_transfer --socket PATH [--blocks N] [--block-size BYTES]
// Decode's block address travels over a pipe, as HIXL users pass it over their
// own RPC; the engine API itself is the one in docs/TRANSFER.md.
//
// Two hosts, each with its own broker (examples/kv_two_hosts.py runs both):
//   kv_transfer --role decode  --socket PATH --listen IP:PORT --secret-file F [--blocks N] [--block-size B]
//     prints "decode: listening on IP:PORT, blocks at 0xADDR", then waits for prefill
//   kv_transfer --role prefill --socket PATH --connect IP:PORT --remote-base 0xADDR --secret-file F [...]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <thread>

#include "membroker/client.h"
#include "membroker/transfer_engine.h"

using namespace membroker;

namespace {

// Block b, byte i: a value the decode side can recompute.
unsigned char Expected(size_t block, size_t i) { return static_cast<unsigned char>(block * 131 + i * 7 + 1); }

int Fail(const char* who, const char* what, const Status& st) {
  std::fprintf(stderr, "%s: %s failed: %s\n", who, what, st.ToString().c_str());
  return 1;
}

// Where the engines are: on one host (names, one broker), or on two (addresses).
struct Net {
  std::string listen, connect, secret_file;
  bool two_hosts() const { return !listen.empty() || !connect.empty(); }
};

int Decode(const std::string& socket, size_t blocks, size_t block_size, int addr_pipe, const Net& net) {
  auto client = Client::Connect({socket, "decode"});
  if (!client.ok()) return Fail("decode", "connect", client.status());
  TransferEngine engine(*client);
  std::map<std::string, std::string> options;
  if (net.two_hosts()) options = {{"listen_address", net.listen}, {"secret_file", net.secret_file}};
  if (Status st = engine.Initialize("decode", options); !st.ok()) return Fail("decode", "Initialize", st);
  const size_t size = blocks * block_size;
  auto handle = client->MallocPhysical(size);
  if (!handle.ok()) return Fail("decode", "MallocPhysical", handle.status());
  auto range = client->ReserveMemAddress(handle->size());
  if (!range.ok()) return Fail("decode", "ReserveMemAddress", range.status());
  auto map = client->MapMem(range->base(), handle->size(), 0, *handle);
  if (!map.ok()) return Fail("decode", "MapMem", map.status());
  MemHandle mem = nullptr;
  auto base = reinterpret_cast<uintptr_t>(map->data());
  if (Status st = engine.RegisterMem({base, handle->size()}, MEM_HOST, mem); !st.ok())
    return Fail("decode", "RegisterMem", st);
  if (net.two_hosts()) {
    NetworkStats ns;
    (void)engine.GetNetworkStats(ns);
    std::printf("decode: listening on %s, blocks at 0x%llx\n", ns.listen_address.c_str(),
                static_cast<unsigned long long>(base));
    std::fflush(stdout);
  } else {
    (void)!::write(addr_pipe, &base, sizeof(base));
    ::close(addr_pipe);
  }

  std::vector<Notify> notifies;
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (;;) {  // a decode loop would do other work between polls
    if (Status st = engine.GetNotifies(notifies); !st.ok()) return Fail("decode", "GetNotifies", st);
    if (!notifies.empty()) break;
    if (std::chrono::steady_clock::now() > give_up) {
      std::fprintf(stderr, "decode: no notify from prefill in 60 s\n");
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::printf("decode: notify \"%s\" from %s: %s\n", notifies[0].name.c_str(),
              notifies[0].remote_engine.c_str(), notifies[0].notify_msg.c_str());
  const auto* bytes = map->as<unsigned char>();
  size_t bad = 0;
  for (size_t b = 0; b < blocks; ++b)
    for (size_t i = 0; i < block_size; ++i) bad += bytes[b * block_size + i] != Expected(b, i);
  std::printf("decode: checked %zu blocks of %zu bytes: %s\n", blocks, block_size,
              bad == 0 ? "all correct" : "MISMATCH");
  if (Status st = engine.DeregisterMem(mem); !st.ok()) return Fail("decode", "DeregisterMem", st);
  return bad == 0 ? 0 : 1;
}

int Prefill(const std::string& socket, size_t blocks, size_t block_size, uintptr_t remote, const Net& net) {
  auto client = Client::Connect({socket, "prefill"});
  if (!client.ok()) return Fail("prefill", "connect", client.status());
  TransferEngine engine(*client);
  std::map<std::string, std::string> options;
  if (net.two_hosts()) options = {{"secret_file", net.secret_file}};
  if (Status st = engine.Initialize("prefill", options); !st.ok()) return Fail("prefill", "Initialize", st);
  const std::string decode = net.two_hosts() ? net.connect : "decode";
  const size_t size = blocks * block_size;
  auto local = client->MallocHost(size);
  if (!local.ok()) return Fail("prefill", "MallocHost", local.status());
  auto* bytes = static_cast<unsigned char*>(*local);
  for (size_t b = 0; b < blocks; ++b)
    for (size_t i = 0; i < block_size; ++i) bytes[b * block_size + i] = Expected(b, i);
  MemHandle mem = nullptr;
  auto base = reinterpret_cast<uintptr_t>(bytes);
  if (Status st = engine.RegisterMem({base, size}, MEM_HOST, mem); !st.ok())
    return Fail("prefill", "RegisterMem", st);
  if (Status st = engine.Connect(decode, 5000); !st.ok()) return Fail("prefill", "Connect", st);
  ConnectionInfo info;
  (void)engine.GetConnectionInfo(decode, info);
  std::printf("prefill: connected to %s: path %s (%s)\n", decode.c_str(), info.path.c_str(), info.transports.c_str());
  std::vector<TransferOpDesc> descs;
  for (size_t b = 0; b < blocks; ++b)
    descs.push_back({base + b * block_size, remote + b * block_size, block_size});
  auto t0 = std::chrono::steady_clock::now();
  if (Status st = engine.TransferSync(decode, WRITE, descs, 10000); !st.ok())
    return Fail("prefill", "TransferSync", st);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("prefill: wrote %zu blocks (%zu MiB) into decode's memory in %.2f ms (%.1f GB/s,\n"
              "         first transfer%s)\n",
              blocks, size >> 20, secs * 1e3, size / secs / 1e9,
              info.path == "ucx" ? " over the connection"
                                 : ": includes mapping decode's memory and faulting its pages");
  if (Status st = engine.SendNotify(decode, {"kv_ready", std::to_string(blocks) + " blocks"}); !st.ok())
    return Fail("prefill", "SendNotify", st);
  (void)engine.Disconnect(decode, 1000);
  (void)engine.DeregisterMem(mem);
  engine.Finalize();
  (void)client->FreeHost(*local);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket, role;
  Net net;
  uintptr_t remote_base = 0;
  size_t blocks = 256, block_size = 64 << 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string flag = argv[i];
    if (flag == "--socket") socket = argv[i + 1];
    else if (flag == "--blocks") blocks = std::stoul(argv[i + 1]);
    else if (flag == "--block-size") block_size = std::stoul(argv[i + 1]);
    else if (flag == "--role") role = argv[i + 1];
    else if (flag == "--listen") net.listen = argv[i + 1];
    else if (flag == "--connect") net.connect = argv[i + 1];
    else if (flag == "--secret-file") net.secret_file = argv[i + 1];
    else if (flag == "--remote-base") remote_base = std::stoull(argv[i + 1], nullptr, 0);
  }
  const bool usable = !socket.empty() && blocks != 0 && block_size != 0 && block_size % 4096 == 0 &&
                      (role.empty() || (role == "decode" && !net.listen.empty() && !net.secret_file.empty()) ||
                       (role == "prefill" && !net.connect.empty() && !net.secret_file.empty() && remote_base != 0));
  if (!usable) {
    std::fprintf(stderr,
                 "usage: kv_transfer --socket PATH [--blocks N] [--block-size BYTES, multiple of 4096]\n"
                 "       kv_transfer --role decode --socket PATH --listen IP:PORT --secret-file F [...]\n"
                 "       kv_transfer --role prefill --socket PATH --connect IP:PORT --remote-base ADDR --secret-file F [...]\n");
    return 2;
  }
  if (role == "decode") return Decode(socket, blocks, block_size, -1, net);
  if (role == "prefill") {
    const int rc = Prefill(socket, blocks, block_size, remote_base, net);
    std::printf("kv_transfer: prefill %s\n", rc == 0 ? "ok" : "FAILED");
    return rc;
  }
  int fds[2];
  if (::pipe(fds) != 0) return 1;
  std::fflush(stdout);
  pid_t decode = ::fork();
  if (decode == 0) {
    ::close(fds[0]);
    int rc = Decode(socket, blocks, block_size, fds[1], net);
    std::fflush(stdout);
    ::_exit(rc);
  }
  ::close(fds[1]);
  uintptr_t remote = 0;
  if (::read(fds[0], &remote, sizeof(remote)) != sizeof(remote)) {
    std::fprintf(stderr, "decode did not start\n");
    return 1;
  }
  int rc = Prefill(socket, blocks, block_size, remote, net);
  int status = 0;
  ::waitpid(decode, &status, 0);
  const bool ok = rc == 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  std::printf("kv_transfer: %s\n", ok ? "ok" : "FAILED");
  return ok ? 0 : 1;
}
