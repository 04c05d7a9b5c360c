// One transfer engine driven by lines on stdin, for the two-host tests and
// benchmarks (tests/net/two_hosts.py, bench/net_transfer.py): the driver runs
// one agent per "host" (network, IPC, PID and mount namespaces of its own,
// each with its own membrokerd) and tells each what to do. Every command is
// answered by one line: "ok ..." or "err CODE message".
//
//   init NAME [key=value ...]        TransferEngine::Initialize; ok LISTEN_ADDRESS
//   alloc broker|host|device BYTES [NAME]
//                                    memory, registered (under NAME); ok INDEX ADDRESS;
//                                    device: CUDA device 0's, from the broker (BYTES a
//                                    multiple of its granularity), MEM_DEVICE
//   fill INDEX SEED                  pattern(SEED) over the whole buffer (device
//                                    memory: through the driver's copies)
//   check INDEX SEED OFFSET LENGTH   ok, or err naming the first wrong byte
//   dereg INDEX                      DeregisterMem
//   connect ADDRESS TIMEOUT_MS       ok PATH TRANSPORTS
//   disconnect ADDRESS TIMEOUT_MS
//   transfer ADDRESS read|write INDEX REMOTE_ADDRESS COUNT SIZE STRIDE TIMEOUT_MS [REPEAT]
//                                    COUNT descriptors of SIZE bytes, the i-th at
//                                    offset i*STRIDE on both sides; ok MIN_US MEDIAN_US
//                                    (of REPEAT runs)
//   async ADDRESS read|write INDEX REMOTE_ADDRESS COUNT SIZE STRIDE TIMEOUT_MS
//                                    TransferAsync; ok (the request runs on)
//   status                           ok WAITING|COMPLETED|TIMEOUT|FAILED of the last async
//   notify ADDRESS NAME MESSAGE      SendNotify
//   notifies                         ok COUNT [FROM NAME MESSAGE]...
//   stats                            ok accepted=N refused=N connections=N
//   pid                              ok PID (as this host's PID namespace sees it)
//   quit
#include <dlfcn.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "map_whole.h"
#include "membroker/client.h"
#include "membroker/transfer_engine.h"

using namespace membroker;

// Under ThreadSanitizer: the bytes fill and check touch are read and written
// by this process's UCX thread on behalf of a peer, ordered by messages that
// pass through another process (our answer on stdout, the driver, the peer's
// request), which TSan cannot see. Those two commands are left out of its view;
// the engine's own threads stay checked.
#if defined(__SANITIZE_THREAD__)
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
struct UnseenByTsan {
  UnseenByTsan() { __tsan_ignore_thread_begin(); }
  ~UnseenByTsan() { __tsan_ignore_thread_end(); }
};
#else
struct UnseenByTsan {};
#endif

namespace {

unsigned char Pattern(uint64_t seed, size_t offset) {
  return static_cast<unsigned char>(offset * 131 + (offset >> 12) * 17 + seed * 29 + 1);
}

struct Buffer {
  char* data = nullptr;
  size_t size = 0;
  MemHandle handle = nullptr;
  bool registered = false;
  // broker memory
  PhysicalHandle physical;
  testing::WholeMapping mem;
  bool host = false;
  // device memory: data is a device address, its bytes reached by the driver's copies
  bool device = false;
  Reservation range;
  Mapping map;
};

// The driver's copies for device buffers, looked up as membroker looks up the
// driver (the agent is built without the CUDA headers), in device 0's primary
// context, made current on first use.
struct DeviceCopies {
  using CopyIn = int (*)(unsigned long long dst, const void* src, size_t n);
  using CopyOut = int (*)(void* dst, unsigned long long src, size_t n);
  CopyIn htod = nullptr;
  CopyOut dtoh = nullptr;
  Status Load() {
    if (htod != nullptr) return Status::Ok();
    void* lib = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    using GetProc = int (*)(const char*, void**, int, unsigned long long, void*);
    auto get = lib ? reinterpret_cast<GetProc>(::dlsym(lib, "cuGetProcAddress_v2")) : nullptr;
    void *retain = nullptr, *set = nullptr, *in = nullptr, *out = nullptr;
    if (get == nullptr || get("cuDevicePrimaryCtxRetain", &retain, 12000, 0, nullptr) != 0 ||
        get("cuCtxSetCurrent", &set, 12000, 0, nullptr) != 0 || get("cuMemcpyHtoD", &in, 12000, 0, nullptr) != 0 ||
        get("cuMemcpyDtoH", &out, 12000, 0, nullptr) != 0)
      return Status(ErrorCode::kUnsupported, "the CUDA driver's copies were not found");
    void* ctx = nullptr;
    if (reinterpret_cast<int (*)(void**, int)>(retain)(&ctx, 0) != 0 ||
        reinterpret_cast<int (*)(void*)>(set)(ctx) != 0)
      return Status(ErrorCode::kUnsupported, "no context on CUDA device 0");
    htod = reinterpret_cast<CopyIn>(in);
    dtoh = reinterpret_cast<CopyOut>(out);
    return Status::Ok();
  }
};

void Reply(const Status& st, const std::string& ok = "") {
  if (st.ok())
    std::cout << "ok" << (ok.empty() ? "" : " ") << ok << std::endl;
  else
    std::cout << "err " << ErrorCodeName(st.code()) << " " << st.message() << std::endl;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: engine_agent SOCKET (then commands on stdin)\n");
    return 2;
  }
  auto client = Client::Connect({argv[1], "engine_agent"});
  if (!client.ok()) {
    std::fprintf(stderr, "engine_agent: connect: %s\n", client.status().ToString().c_str());
    return 1;
  }
  TransferEngine engine(*client);
  DeviceCopies device_copies;
  std::vector<std::unique_ptr<Buffer>> buffers;
  TransferReq last_async = 0;
  auto buffer = [&](size_t i) -> Buffer* { return i < buffers.size() ? buffers[i].get() : nullptr; };
  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string cmd;
    in >> cmd;
    if (cmd == "init") {
      std::string name, kv;
      in >> name;
      std::map<std::string, std::string> options;
      while (in >> kv) {
        auto eq = kv.find('=');
        options[kv.substr(0, eq)] = eq == std::string::npos ? "" : kv.substr(eq + 1);
      }
      Status st = engine.Initialize(name, options);
      NetworkStats ns;
      if (st.ok()) st = engine.GetNetworkStats(ns);
      Reply(st, ns.listen_address.empty() ? "-" : ns.listen_address);
    } else if (cmd == "alloc") {
      std::string kind, name;
      size_t bytes = 0;
      in >> kind >> bytes >> name;  // (name: optional)
      auto b = std::make_unique<Buffer>();
      b->size = bytes;
      Status st;
      if (kind == "broker") {
        auto h = client->MallocPhysical(bytes);
        auto m = h.ok() ? testing::MapWhole(*client, *h, kMapPopulate) : Result<testing::WholeMapping>(h.status());
        st = m.status();
        if (st.ok()) {
          b->data = m->as<char>();
          b->physical = std::move(*h);
          b->mem = std::move(*m);
        }
      } else if (kind == "device") {
        AllocationProp prop;
        prop.location = MemLocation{MemLocation::kDevice, 0};
        auto h = client->MallocPhysical(bytes, prop);
        auto r = h.ok() ? client->ReserveMemAddress(bytes, 0, nullptr, kReserveDevice) : Result<Reservation>(h.status());
        auto m = r.ok() ? client->MapMem(r->base(), bytes, 0, *h) : Result<Mapping>(r.status());
        st = m.ok() ? device_copies.Load() : m.status();
        if (st.ok()) {
          b->data = static_cast<char*>(m->data());
          b->physical = std::move(*h);
          b->range = std::move(*r);
          b->map = std::move(*m);
          b->device = true;
        }
      } else if (kind == "host") {
        void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_POPULATE, -1, 0);
        st = p == MAP_FAILED ? Status(ErrorCode::kResourceExhausted, "mmap") : client->HostRegister(p, bytes);
        if (st.ok()) b->data = static_cast<char*>(p), b->host = true;
      } else {
        st = Status(ErrorCode::kParamInvalid, "alloc broker|host|device BYTES");
      }
      if (st.ok())
        st = engine.RegisterMem({reinterpret_cast<uintptr_t>(b->data), bytes}, b->device ? MEM_DEVICE : MEM_HOST,
                                b->handle, name);
      b->registered = st.ok();
      const size_t index = buffers.size();
      const uintptr_t addr = reinterpret_cast<uintptr_t>(b->data);
      if (st.ok()) buffers.push_back(std::move(b));
      Reply(st, std::to_string(index) + " " + std::to_string(addr));
    } else if (cmd == "fill" || cmd == "check") {
      [[maybe_unused]] UnseenByTsan unseen;
      size_t index = 0, off = 0, len = 0;
      uint64_t seed = 0;
      in >> index >> seed;
      Buffer* b = buffer(index);
      if (b == nullptr) {
        Reply(Status(ErrorCode::kParamInvalid, "no such buffer"));
        continue;
      }
      // A device buffer's bytes come through a host copy of them.
      std::vector<char> staged;
      char* bytes = b->data;
      if (b->device) {
        staged.resize(b->size);
        bytes = staged.data();
        if (cmd == "check" &&
            device_copies.dtoh(staged.data(), reinterpret_cast<uintptr_t>(b->data), b->size) != 0) {
          Reply(Status(ErrorCode::kInternal, "cuMemcpyDtoH failed"));
          continue;
        }
      }
      if (cmd == "fill") {
        for (size_t i = 0; i < b->size; ++i) bytes[i] = static_cast<char>(Pattern(seed, i));
        if (b->device && device_copies.htod(reinterpret_cast<uintptr_t>(b->data), bytes, b->size) != 0) {
          Reply(Status(ErrorCode::kInternal, "cuMemcpyHtoD failed"));
          continue;
        }
        Reply(Status::Ok());
        continue;
      }
      in >> off >> len;
      Status st;
      for (size_t i = off; i < off + len && i < b->size; ++i)
        if (static_cast<unsigned char>(bytes[i]) != Pattern(seed, i)) {
          st = Status(ErrorCode::kInternal, "byte " + std::to_string(i) + " is " +
                                                std::to_string(static_cast<unsigned char>(bytes[i])) + ", expected " +
                                                std::to_string(Pattern(seed, i)));
          break;
        }
      Reply(st);
    } else if (cmd == "dereg") {
      size_t index = 0;
      in >> index;
      Buffer* b = buffer(index);
      Status st = b == nullptr ? Status(ErrorCode::kParamInvalid, "no such buffer") : engine.DeregisterMem(b->handle);
      Reply(st);
    } else if (cmd == "connect" || cmd == "disconnect") {
      std::string addr;
      int timeout = 1000;
      in >> addr >> timeout;
      if (cmd == "disconnect") {
        Reply(engine.Disconnect(addr, timeout));
        continue;
      }
      Status st = engine.Connect(addr, timeout);
      ConnectionInfo info;
      if (st.ok()) st = engine.GetConnectionInfo(addr, info);
      Reply(st, info.path + " " + (info.transports.empty() ? "-" : info.transports));
    } else if (cmd == "transfer" || cmd == "async") {
      std::string addr, op;
      size_t index = 0, count = 0, size = 0, stride = 0;
      uintptr_t remote = 0;
      int timeout = 1000, repeat = 1;
      in >> addr >> op >> index >> remote >> count >> size >> stride >> timeout;
      if (!(in >> repeat)) repeat = 1;
      Buffer* b = buffer(index);
      if (b == nullptr) {
        Reply(Status(ErrorCode::kParamInvalid, "no such buffer"));
        continue;
      }
      std::vector<TransferOpDesc> descs;
      for (size_t i = 0; i < count; ++i)
        descs.push_back({reinterpret_cast<uintptr_t>(b->data) + i * stride, remote + i * stride, size});
      const TransferOp top = op == "write" ? WRITE : READ;
      if (cmd == "async") {
        Reply(engine.TransferAsync(addr, top, descs, last_async, timeout));
        continue;
      }
      Status st;
      std::vector<double> us;
      for (int r = 0; r < repeat && st.ok(); ++r) {
        auto t0 = std::chrono::steady_clock::now();
        st = engine.TransferSync(addr, top, descs, timeout);
        us.push_back(std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
      }
      std::sort(us.begin(), us.end());
      char times[64];
      std::snprintf(times, sizeof(times), "%.1f %.1f", us.front(), us[us.size() / 2]);
      Reply(st, times);
    } else if (cmd == "status") {
      TransferStatus ts;
      Status st = engine.GetTransferStatus(last_async, ts);
      const char* names[] = {"WAITING", "COMPLETED", "TIMEOUT", "FAILED"};
      Reply(st, names[static_cast<int>(ts)] + std::string(ts == TransferStatus::FAILED || ts == TransferStatus::TIMEOUT
                                                             ? " " + engine.last_error().ToString()
                                                             : ""));
    } else if (cmd == "notify") {
      std::string addr, name, msg;
      in >> addr >> name >> msg;
      Reply(engine.SendNotify(addr, {name, msg}, 2000));
    } else if (cmd == "notifies") {
      std::vector<Notify> got;
      Status st = engine.GetNotifies(got);
      std::string out = std::to_string(got.size());
      for (auto& n : got) out += " " + n.remote_engine + " " + n.name + " " + n.notify_msg;
      Reply(st, out);
    } else if (cmd == "stats") {
      NetworkStats ns;
      Status st = engine.GetNetworkStats(ns);
      Reply(st, "accepted=" + std::to_string(ns.accepted) + " refused=" + std::to_string(ns.refused) +
                    " connections=" + std::to_string(ns.connections));
    } else if (cmd == "pid") {
      Reply(Status::Ok(), std::to_string(::getpid()));
    } else if (cmd == "quit") {
      break;
    } else if (!cmd.empty()) {
      Reply(Status(ErrorCode::kParamInvalid, "unknown command " + cmd));
    }
  }
  engine.Finalize();
  for (auto& b : buffers)
    if (b->host) {
      (void)client->HostUnregister(b->data);
      ::munmap(b->data, b->size);
    }
  return 0;
}
