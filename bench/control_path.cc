// Control-path latency of the broker against its physical floor, measured in
// the same run: a bare SOCK_SEQPACKET round trip to an echo process (with and
// without one fd), and the raw syscalls an allocation needs.
//   bench/control_path [--broker PATH_TO_membrokerd] [google benchmark flags]
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include <benchmark/benchmark.h>

#include "membroker/client.h"
#include "raw_fd.h"

using namespace membroker;

namespace {

std::string g_socket;
pid_t g_broker = -1;

// An echo process on a socketpair: the bare round trip a broker request cannot beat.
struct Echo {
  int fd = -1;
  pid_t pid = -1;
  Echo() {
    int sv[2];
    ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
    pid = ::fork();
    if (pid == 0) {
      ::close(sv[0]);
      char buf[256];
      for (;;) {
        int fd = -1;
        ssize_t n = bench::RawRecv(sv[1], buf, sizeof(buf), &fd);
        if (n <= 0) _exit(0);
        // Echo the bytes and any fd back, as the broker's reply carries one.
        bench::RawSend(sv[1], buf, static_cast<size_t>(n), fd);
        if (fd >= 0) ::close(fd);
      }
    }
    ::close(sv[1]);
    fd = sv[0];
  }
  ~Echo() {
    ::close(fd);
    ::waitpid(pid, nullptr, 0);
  }
};

void RoundTrip(int fd, int send_fd) {
  char buf[64] = {1};
  bench::RawSend(fd, buf, 48, send_fd);
  int got = -1;
  bench::RawRecv(fd, buf, sizeof(buf), &got);
  if (got >= 0) ::close(got);
}

void BM_Floor_SeqpacketRoundTrip(benchmark::State& state) {
  Echo echo;
  for (auto _ : state) RoundTrip(echo.fd, -1);
}
BENCHMARK(BM_Floor_SeqpacketRoundTrip)->UseRealTime();

void BM_Floor_SeqpacketRoundTripWithFd(benchmark::State& state) {
  Echo echo;
  int fd = ::memfd_create("x", MFD_CLOEXEC);
  for (auto _ : state) RoundTrip(echo.fd, fd);
  ::close(fd);
}
BENCHMARK(BM_Floor_SeqpacketRoundTripWithFd)->UseRealTime();

void BM_Floor_MemfdSyscalls(benchmark::State& state) {
  const size_t size = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    int fd = ::memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    ::ftruncate(fd, static_cast<off_t>(size));
    ::fallocate(fd, 0, 0, static_cast<off_t>(size));
    ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
    ::close(fd);
  }
}
BENCHMARK(BM_Floor_MemfdSyscalls)->Arg(4096)->Arg(2 << 20)->UseRealTime();

Client Connect() {
  auto c = Client::Connect({g_socket, "bench"});
  if (!c.ok()) {
    std::fprintf(stderr, "bench: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*c);
}

void BM_Broker_ConnectHandshake(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Connect());
}
BENCHMARK(BM_Broker_ConnectHandshake)->UseRealTime();

void BM_Broker_Ping(benchmark::State& state) {
  Client c = Connect();
  for (auto _ : state) (void)c.Ping();
}
BENCHMARK(BM_Broker_Ping)->UseRealTime();

void BM_Broker_MallocFree(benchmark::State& state) {
  Client c = Connect();
  const size_t size = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    auto h = c.MallocPhysical(size);
    if (!h.ok()) state.SkipWithError(h.status().ToString().c_str());
  }  // the release is one-way: it costs no round trip
}
BENCHMARK(BM_Broker_MallocFree)->Arg(4096)->Arg(2 << 20)->UseRealTime();

// An 8 KiB pool is configured in StartBroker: these come ready-made.
void BM_Broker_MallocPooled(benchmark::State& state) {
  Client c = Connect();
  for (auto _ : state) {
    auto h = c.MallocPhysical(8192);
    if (!h.ok() || !h->from_pool()) {
      state.SkipWithError(h.ok() ? "not served from the pool" : h.status().ToString().c_str());
      break;
    }
  }
}
BENCHMARK(BM_Broker_MallocPooled)->UseRealTime();

void BM_Broker_Export(benchmark::State& state) {
  Client c = Connect();
  auto h = c.MallocPhysical(4096);
  for (auto _ : state) benchmark::DoNotOptimize(c.ExportToShareableHandle(*h, kExportNoPidCheck));
}
BENCHMARK(BM_Broker_Export)->UseRealTime()->Iterations(20000);

void BM_Broker_ImportFree(benchmark::State& state) {
  Client owner = Connect();
  Client importer = Connect();
  auto h = owner.MallocPhysical(4096);
  auto token = owner.ExportToShareableHandle(*h, kExportNoPidCheck);
  for (auto _ : state) {
    auto imported = importer.ImportFromShareableHandle(*token);
    if (!imported.ok()) state.SkipWithError(imported.status().ToString().c_str());
  }
}
BENCHMARK(BM_Broker_ImportFree)->UseRealTime();

void BM_Local_MapUnmap(benchmark::State& state) {
  Client c = Connect();
  const size_t size = static_cast<size_t>(state.range(0));
  auto h = c.MallocPhysical(size);
  auto r = c.ReserveMemAddress(size);
  for (auto _ : state) {
    auto m = c.MapMem(r->base(), size, 0, *h);
    benchmark::DoNotOptimize(m);
  }
}
BENCHMARK(BM_Local_MapUnmap)->Arg(4096)->Arg(2 << 20)->UseRealTime();

void BM_Local_SetAccess(benchmark::State& state) {
  Client c = Connect();
  auto h = c.MallocPhysical(1 << 20);
  auto r = c.ReserveMemAddress(1 << 20);
  auto m = c.MapMem(r->base(), 1 << 20, 0, *h);
  bool ro = false;
  for (auto _ : state) {
    (void)c.MemSetAccess(m->data(), 1 << 20, ro ? Access::kRead : Access::kReadWrite);
    ro = !ro;
  }
}
BENCHMARK(BM_Local_SetAccess)->UseRealTime();

// An importer maps an existing allocation and touches every page: the cost of
// a hand-off in the consumer. Args: size in MiB, and 1 for 2 MiB pages (skipped
// without enough free huge pages).
void BM_Consumer_ImportMapTouch(benchmark::State& state) {
  const size_t size = static_cast<size_t>(state.range(0)) << 20;
  const bool huge = state.range(1) != 0;
  Client owner = Connect();
  Client importer = Connect();
  auto h = owner.MallocPhysical(size, AllocationProp{huge ? PagePolicy::kHugeOnly : PagePolicy::kNormalOnly});
  if (!h.ok()) {
    state.SkipWithError(h.status().ToString().c_str());
    return;
  }
  auto token = owner.ExportToShareableHandle(*h, kExportNoPidCheck);
  auto r = importer.ReserveMemAddress(size);
  for (auto _ : state) {
    auto imported = importer.ImportFromShareableHandle(*token);
    auto m = importer.MapMem(r->base(), size, 0, *imported);
    const volatile char* p = m->as<char>();
    for (size_t off = 0; off < size; off += h->page_size()) (void)p[off];  // one byte per page
  }
  state.SetLabel(huge ? "2 MiB pages" : "4 KiB pages");
}
BENCHMARK(BM_Consumer_ImportMapTouch)
    ->Args({32, 0})
    ->Args({32, 1})
    ->Args({1024, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

void StartBroker(const std::string& binary) {
  char tmpl[] = "/tmp/membroker-bench.XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  g_socket = dir + "/b.sock";
  int ready[2];
  ::pipe(ready);
  g_broker = ::fork();
  if (g_broker == 0) {
    ::dup2(ready[1], 3);
    ::execl(binary.c_str(), binary.c_str(), "--socket", g_socket.c_str(), "--ready-fd", "3",
            "--pool", "8K:normal:256", "--log-level", "warn", nullptr);
    _exit(127);
  }
  ::close(ready[1]);
  char buf[64];
  if (::read(ready[0], buf, sizeof(buf)) <= 0) {
    std::fprintf(stderr, "bench: broker %s did not start\n", binary.c_str());
    std::exit(1);
  }
  ::close(ready[0]);
}

}  // namespace

int main(int argc, char** argv) {
  std::string broker = MEMBROKER_BROKER_BINARY;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--broker")) broker = argv[i + 1];
  StartBroker(broker);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  ::kill(g_broker, SIGTERM);
  ::waitpid(g_broker, nullptr, 0);
  return 0;
}
