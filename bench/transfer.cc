// Transfer engine bandwidth against its floors, measured in the same run:
// TransferSync / TransferAsync READ from a peer process's broker memory (memcpy
// through a cached mapping) and from its own HostRegister'ed memory (cross-memory
// attach), single descriptors and batches, against plain memcpy between two
// local buffers and raw process_vm_readv of the same bytes.
// Prints one JSON line per case.
//   bench_transfer --socket PATH [--quick]
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "membroker/client.h"
#include "membroker/transfer_engine.h"

using namespace membroker;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kArena = 64 << 20;

void Check(const Status& st, const char* what) {
  if (!st.ok()) {
    std::fprintf(stderr, "bench_transfer: %s: %s\n", what, st.ToString().c_str());
    std::exit(1);
  }
}

// The peer: registers kArena of broker memory and kArena of pinned heap memory,
// reports both addresses, and lives until its stdin pipe closes.
int Serve(const std::string& socket, int to_parent, int from_parent) {
  auto c = Client::Connect({socket, "bench-peer"});
  Check(c.status(), "peer connect");
  TransferEngine engine(*c);
  Check(engine.Initialize("peer"), "peer Initialize");
  auto h = c->MallocPhysical(kArena);
  Check(h.status(), "peer MallocPhysical");
  auto r = c->ReserveMemAddress(kArena);
  auto m = c->MapMem(r->base(), kArena, 0, *h, kMapPopulate);
  Check(m.status(), "peer MapMem");
  void* heap = std::aligned_alloc(4096, kArena);
  std::memset(heap, 1, kArena);
  std::memset(m->data(), 2, kArena);
  Check(c->HostRegister(heap, kArena), "peer HostRegister");
  MemHandle a = nullptr, b = nullptr;
  Check(engine.RegisterMem({reinterpret_cast<uintptr_t>(m->data()), kArena}, MEM_HOST, a), "peer RegisterMem");
  Check(engine.RegisterMem({reinterpret_cast<uintptr_t>(heap), kArena}, MEM_HOST, b), "peer RegisterMem heap");
  uintptr_t addrs[2] = {reinterpret_cast<uintptr_t>(m->data()), reinterpret_cast<uintptr_t>(heap)};
  (void)!::write(to_parent, addrs, sizeof(addrs));
  char byte;
  (void)!::read(from_parent, &byte, 1);  // EOF: the bench is done
  return 0;
}

// Bytes per second of fn, which moves `bytes` per call; runs for min_seconds.
double Rate(size_t bytes, double min_seconds, const std::function<void()>& fn) {
  fn();  // warm: mappings, page tables, caches
  size_t calls = 0;
  auto t0 = Clock::now();
  double secs = 0;
  do {
    fn();
    ++calls;
    secs = std::chrono::duration<double>(Clock::now() - t0).count();
  } while (secs < min_seconds);
  return static_cast<double>(bytes) * calls / secs;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) socket = argv[++i];
    if (a == "--quick") quick = true;
  }
  if (socket.empty()) {
    std::fprintf(stderr, "usage: bench_transfer --socket PATH [--quick]\n");
    return 2;
  }
  int up[2], down[2];
  if (::pipe(up) != 0 || ::pipe(down) != 0) return 1;
  pid_t peer = ::fork();
  if (peer == 0) {
    ::close(up[0]);
    ::close(down[1]);
    ::_exit(Serve(socket, up[1], down[0]));
  }
  ::close(up[1]);
  ::close(down[0]);
  uintptr_t remote[2];
  if (::read(up[0], remote, sizeof(remote)) != sizeof(remote)) return 1;

  auto c = Client::Connect({socket, "bench"});
  Check(c.status(), "connect");
  TransferEngine engine(*c);
  Check(engine.Initialize("bench"), "Initialize");
  auto local = c->MallocHost(kArena);
  Check(local.status(), "MallocHost");
  auto* dst = static_cast<char*>(*local);
  std::memset(dst, 0, kArena);
  MemHandle mh = nullptr;
  Check(engine.RegisterMem({reinterpret_cast<uintptr_t>(dst), kArena}, MEM_HOST, mh), "RegisterMem");
  Check(engine.Connect("peer", 5000), "Connect");
  std::vector<char> src(kArena, 3);  // memcpy's source: this process's memory

  const double min_s = quick ? 0.05 : 0.3;
  std::vector<size_t> sizes = quick ? std::vector<size_t>{4096, 1 << 20, 64 << 20}
                                    : std::vector<size_t>{4096, 64 << 10, 1 << 20, 16 << 20, 64 << 20};
  const char* kinds[2] = {"broker", "pageable"};
  for (int kind = 0; kind < 2; ++kind) {
    for (size_t size : sizes) {
      // Batches: as many descriptors of `size` as fit in the arena, capped at 1000.
      const size_t n = std::min<size_t>(1000, kArena / size);
      std::vector<TransferOpDesc> batch;
      std::vector<iovec> liov, riov;
      for (size_t i = 0; i < n; ++i) {
        batch.push_back({reinterpret_cast<uintptr_t>(dst) + i * size, remote[kind] + i * size, size});
        liov.push_back({dst + i * size, size});
        riov.push_back({reinterpret_cast<void*>(remote[kind] + i * size), size});
      }
      const size_t total = n * size;
      double single = Rate(size, min_s, [&] {
        Check(engine.TransferSync("peer", READ, {batch[0]}, 60000), "TransferSync");
      });
      double batched = Rate(total, min_s, [&] {
        Check(engine.TransferSync("peer", READ, batch, 60000), "TransferSync batch");
      });
      double async = Rate(total, min_s, [&] {
        TransferReq req = 0;
        Check(engine.TransferAsync("peer", READ, batch, req, 60000), "TransferAsync");
        TransferStatus st = TransferStatus::WAITING;
        while (st == TransferStatus::WAITING) {
          std::this_thread::yield();  // two cores: let the async thread run
          Check(engine.GetTransferStatus(req, st), "GetTransferStatus");
        }
        if (st != TransferStatus::COMPLETED) Check(engine.last_error(), "async transfer");
      });
      double memcpy_rate = Rate(total, min_s, [&] {
        for (size_t i = 0; i < n; ++i) std::memcpy(dst + i * size, src.data() + i * size, size);
      });
      double vm_rate = Rate(total, min_s, [&] {
        for (size_t first = 0; first < n; first += 1024) {
          size_t k = std::min<size_t>(1024, n - first);
          if (::process_vm_readv(peer, &liov[first], k, &riov[first], k, 0) < 0) std::exit(1);
        }
      });
      std::printf("{\"bench\": \"transfer\", \"memory\": \"%s\", \"desc_bytes\": %zu, \"batch\": %zu, "
                  "\"sync_single_gbps\": %.3f, \"sync_batch_gbps\": %.3f, \"async_batch_gbps\": %.3f, "
                  "\"memcpy_gbps\": %.3f, \"process_vm_readv_gbps\": %.3f, \"batch_descs_per_s\": %.0f}\n",
                  kinds[kind], size, n, single / 1e9, batched / 1e9, async / 1e9, memcpy_rate / 1e9,
                  vm_rate / 1e9, batched / size);
      std::fflush(stdout);
    }
  }
  ::close(down[1]);
  int status = 0;
  ::waitpid(peer, &status, 0);
  return 0;
}
