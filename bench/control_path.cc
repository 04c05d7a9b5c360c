// Control-path latency of the broker against its physical floor, measured in
// the same run: a bare SOCK_SEQPACKET round trip to an echo process (with and
// without one fd), and the raw syscalls an allocation needs.
// With --paired ROUNDS, instead: the round-trip operations interleaved call by
// call with their floors (medians; --one-cpu pins everything to CPU 0,
// --cross-cpu the servers to CPU 0 and the calling side to CPU 1).
//   bench/control_path [--broker PATH_TO_membrokerd] [google benchmark flags]
//   bench/control_path [--broker PATH] --paired ROUNDS [--one-cpu | --cross-cpu] [--only OP]
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <benchmark/benchmark.h>

#include "membroker/client.h"
#include "broker_launch.h"
#include "payload.h"
#include "membroker/ipc/admin_client.h"
#include "raw_fd.h"
#include "schedstat.h"

using namespace membroker;

namespace {

// Two brokers: one without pools, one whose pools serve the pooled cases.
std::string g_socket, g_pool_socket;
pid_t g_broker = -1, g_pool_broker = -1;
// Iterations of each pooled case (4 KiB, 2 MiB, 64 MiB); each pool holds as many.
constexpr int kPooledIterations[] = {1000, 64, 8};

// The first byte of a message the echo process reads and does not answer.
constexpr char kOneWayMark = 0x7f;

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
        // Echo the bytes and any fd back, as the broker's reply carries one
        // (a one-way message, as a free, is read and not answered).
        if (buf[0] != kOneWayMark) bench::RawSend(sv[1], buf, static_cast<size_t>(n), fd);
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

// A one-way message the size of a FreeRequest: what an operation "+ one-way
// free" sends besides its round trip, so its floor sends it too.
void OneWay(int fd) {
  char buf[72] = {kOneWayMark};
  bench::RawSend(fd, buf, sizeof(buf), -1);
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

void BM_Floor_SeqpacketRoundTripWithFdOneWay(benchmark::State& state) {
  Echo echo;
  int fd = ::memfd_create("x", MFD_CLOEXEC);
  for (auto _ : state) {
    RoundTrip(echo.fd, fd);
    OneWay(echo.fd);
  }
  ::close(fd);
}
BENCHMARK(BM_Floor_SeqpacketRoundTripWithFdOneWay)->UseRealTime();

// A process serving a listening SEQPACKET socket in a directory of its own;
// killed, and its socket removed, with this object.
struct ForkedServer {
  std::string path;
  sockaddr_un addr{};
  pid_t pid = -1;
  ForkedServer(const char* file, int socket_flags, void (*serve)(int listening_fd)) {
    char tmpl[] = "/tmp/membroker-floor.XXXXXX";
    path = std::string(::mkdtemp(tmpl)) + "/" + file;
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
    int lfd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | socket_flags, 0);
    if (::bind(lfd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || ::listen(lfd, 64) != 0) {
      std::perror("bench: floor server bind/listen");
      std::exit(1);
    }
    pid = ::fork();
    if (pid == 0) {
      serve(lfd);
      _exit(0);
    }
    ::close(lfd);
  }
  ~ForkedServer() {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::unlink(path.c_str());
    ::rmdir(path.substr(0, path.rfind('/')).c_str());
  }
  // A connected socket, or -1.
  int Connect() const {
    int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof(addr)) == 0) return fd;
    ::close(fd);
    return -1;
  }
};

// The floor for connect + handshake: a server that accepts, echoes one
// message and closes; a sample is connect, one round trip, close.
struct ListeningEcho {
  ForkedServer server{"echo.sock", 0, &Serve};
  static void Serve(int lfd) {
    char buf[256];
    for (int c; (c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0;) {
      ssize_t n = ::recv(c, buf, sizeof(buf), 0);
      if (n > 0) ::send(c, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
      ::close(c);
    }
  }
  bool ConnectRoundTrip() const {
    const int fd = server.Connect();
    if (fd < 0) return false;
    RoundTrip(fd, -1);
    ::close(fd);
    return true;
  }
};

// The floor for what a server with sessions has to do on top: it keeps the
// connection (so it can tell when its client goes) and closes it when the
// client does, after a goodbye, as the broker's clients say. One epoll loop;
// a sample is connect, a round trip (the hello), a one-way goodbye, close.
struct SessionEcho {
  static constexpr char kHello = 1, kGoodbye = 2;
  ForkedServer server{"session.sock", SOCK_NONBLOCK, &Serve};
  static void Serve(int lfd) {
    int ep = ::epoll_create1(EPOLL_CLOEXEC);
    epoll_event ev{EPOLLIN, {.fd = lfd}};
    ::epoll_ctl(ep, EPOLL_CTL_ADD, lfd, &ev);
    epoll_event ready[64];
    char buf[256];
    for (;;) {
      int n = ::epoll_wait(ep, ready, 64, -1);
      if (n < 0 && errno != EINTR) return;
      for (int i = 0; i < n; ++i) {
        const int fd = ready[i].data.fd;
        if (fd == lfd) {
          int c = ::accept4(lfd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          epoll_event cev{EPOLLIN, {.fd = c}};
          if (c >= 0) ::epoll_ctl(ep, EPOLL_CTL_ADD, c, &cev);
          continue;
        }
        for (;;) {
          ssize_t got = ::recv(fd, buf, sizeof(buf), 0);
          if (got > 0 && buf[0] == kHello) ::send(fd, buf, static_cast<size_t>(got), MSG_NOSIGNAL);
          if (got == 0 || (got < 0 && errno != EAGAIN)) ::close(fd);  // leaves the epoll set with it
          if (got <= 0) break;
        }
      }
    }
  }
  bool ConnectRoundTripGoodbye() const {
    const int fd = server.Connect();
    if (fd < 0) return false;
    char buf[64] = {kHello};
    bool ok = ::send(fd, buf, 48, MSG_NOSIGNAL) == 48 && ::recv(fd, buf, sizeof(buf), 0) == 48;
    buf[0] = kGoodbye;
    ok = ok && ::send(fd, buf, 48, MSG_NOSIGNAL) == 48;
    ::close(fd);
    return ok;
  }
};

void BM_Floor_ConnectRoundTrip(benchmark::State& state) {
  ListeningEcho echo;
  for (auto _ : state) {
    if (!echo.ConnectRoundTrip()) {
      state.SkipWithError("connect failed");
      break;
    }
  }
}
BENCHMARK(BM_Floor_ConnectRoundTrip)->UseRealTime();

void BM_Floor_ConnectSession(benchmark::State& state) {
  SessionEcho echo;
  for (auto _ : state) {
    if (!echo.ConnectRoundTripGoodbye()) {
      state.SkipWithError("connect failed");
      break;
    }
  }
}
BENCHMARK(BM_Floor_ConnectSession)->UseRealTime();

// The system calls a MallocPhysical needs: create, size, populate, seal.
void MemfdSyscalls(size_t size) {
  int fd = ::memfd_create("x", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ::ftruncate(fd, static_cast<off_t>(size));
  ::fallocate(fd, 0, 0, static_cast<off_t>(size));
  ::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
  ::close(fd);
}

void BM_Floor_MemfdSyscalls(benchmark::State& state) {
  const size_t size = static_cast<size_t>(state.range(0));
  for (auto _ : state) MemfdSyscalls(size);
}
BENCHMARK(BM_Floor_MemfdSyscalls)->Arg(4096)->Arg(2 << 20)->Arg(64 << 20)->UseRealTime();

Client Connect(const std::string& socket = g_socket) {
  auto c = Client::Connect({socket, "bench"});
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
BENCHMARK(BM_Broker_MallocFree)->Arg(4096)->Arg(2 << 20)->Arg(64 << 20)->UseRealTime();

std::string PoolBrokerAdmin(const std::string& command) {
  auto reply = ipc::AskAdmin(g_pool_socket + ".admin", command);
  return reply.ok() ? *reply : "";
}

// True when every pool is full and no freed memory is still being returned:
// the broker's workers are idle, as a pool's refills would be between bursts.
bool PoolBrokerQuiet() {
  std::string pools = PoolBrokerAdmin("list pools --json");
  for (size_t at = 0; (at = pools.find("\"capacity\": ", at)) != std::string::npos;) {
    unsigned long capacity = std::strtoul(pools.c_str() + at + 12, nullptr, 10);
    size_t r = pools.find("\"ready\": ", at);
    if (r == std::string::npos || std::strtoul(pools.c_str() + r + 9, nullptr, 10) != capacity) return false;
    at = r;
  }
  return PoolBrokerAdmin("stats --json").find("\"bytes_returning\": 0,") != std::string::npos;
}

// The pool broker keeps kPooledIterations allocations of each size ready and
// refills them on its worker threads. Each run starts once the refills of the
// previous one are done, so every request is a pool hit and no refill competes
// for the CPUs while it is timed.
void WaitForQuietPoolBroker() {
  for (auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
       !PoolBrokerQuiet() && std::chrono::steady_clock::now() < deadline;)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

void BM_Broker_MallocPooled(benchmark::State& state) {
  WaitForQuietPoolBroker();
  Client c = Connect(g_pool_socket);
  const size_t size = static_cast<size_t>(state.range(0));
  for (auto _ : state) {
    auto h = c.MallocPhysical(size);
    if (!h.ok() || !h->from_pool()) {
      state.SkipWithError(h.ok() ? "not served from the pool" : h.status().ToString().c_str());
      break;
    }
  }
}
BENCHMARK(BM_Broker_MallocPooled)->Arg(4096)->Iterations(kPooledIterations[0])->UseRealTime();
BENCHMARK(BM_Broker_MallocPooled)->Arg(2 << 20)->Iterations(kPooledIterations[1])->UseRealTime();
BENCHMARK(BM_Broker_MallocPooled)->Arg(64 << 20)->Iterations(kPooledIterations[2])->UseRealTime();

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

// --paired ROUNDS: each operation against its floor, interleaved call by call
// (floor, operation, next pair, ...; the order flips every round) and timed one
// call at a time, so both see the same machine at the same moment. Prints one
// JSON line per operation with both medians and p99s. Means over whole runs,
// as above, move with every stall of this VM; medians of interleaved calls
// hold still.
struct Pair {
  const char* op;
  const char* floor;
  std::function<void()> run_op, run_floor;
  pid_t op_server, floor_server;  // the broker, or the echo process
  std::function<void()> before_round = {};  // untimed, before the pair's two calls
  std::vector<double> op_us = {}, floor_us = {};
};

// Microseconds a process has run.
double CpuTimeUs(pid_t pid) { return bench::ReadSchedStat("/proc/" + std::to_string(pid) + "/schedstat").cpu_us; }

double Mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / v.size();
}

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[std::min(v.size() - 1, static_cast<size_t>(v.size() * q))];
}

// Where the processes of a paired run are. Left to the scheduler (kAny), the
// broker and the echo processes do not land alike: in a sampled run the
// broker was on the other vCPU than the client in 99.7% of the samples, the
// echo processes on the client's own in 88-98%, so the two sides of a pair
// were not measured under the same conditions. kCross and kOne place them.
enum class Placement { kAny, kCross, kOne };
const char* PlacementName(Placement p) {
  return p == Placement::kCross ? "cross" : p == Placement::kOne ? "one" : "any";
}

constexpr size_t kBlocks = 10;  // of a paired run, each with its own ratio

int RunPaired(int rounds, Placement placement, const std::string& only) {
  Echo echo;
  ListeningEcho listening;
  SessionEcho session_echo;
  int memfd = ::memfd_create("x", MFD_CLOEXEC);
  // Cross: the servers (brokers, echo processes) were started on CPU 0;
  // the calling side moves to CPU 1, so every message of both crosses.
  if (placement == Placement::kCross && !bench::PinToCpu(1)) {
    std::perror("bench: sched_setaffinity to CPU 1");
    return 1;
  }
  Client c = Connect(), importer = Connect(), pooled = Connect(g_pool_socket);
  auto held = c.MallocPhysical(4096);
  auto token = c.ExportToShareableHandle(*held, kExportNoPidCheck);
  uint64_t pool_misses = 0;
  std::vector<Pair> pairs;
  pairs.push_back({"connect", "connect + round trip", [] { (void)Connect(); },
                   [&] { (void)listening.ConnectRoundTrip(); }, g_broker, listening.server.pid});
  pairs.push_back({"connect_session", "connect + round trip + goodbye, the server keeps the session",
                   [] { (void)Connect(); }, [&] { (void)session_echo.ConnectRoundTripGoodbye(); }, g_broker,
                   session_echo.server.pid});
  pairs.push_back({"ping", "round trip", [&] { (void)c.Ping(); }, [&] { RoundTrip(echo.fd, -1); }, g_broker,
                   echo.pid});
  pairs.push_back({"malloc_4k", "round trip with fd + one-way message + memfd syscalls",
                   [&] { (void)c.MallocPhysical(4096); },
                   [&] {
                     MemfdSyscalls(4096);
                     RoundTrip(echo.fd, memfd);
                     OneWay(echo.fd);
                   },
                   g_broker, echo.pid});
  // A take from the pool broker and its one-way free; its floor sends a
  // memfd in a round trip and one message more.
  auto take_pooled = [&](size_t size) {
    return [&, size] {
      auto h = pooled.MallocPhysical(size);
      if (!h.ok() || !h->from_pool()) ++pool_misses;
    };
  };
  auto fd_floor = [&] {
    RoundTrip(echo.fd, memfd);
    OneWay(echo.fd);
  };
  pairs.push_back({"malloc_4k_pooled", "round trip with fd + one-way message", take_pooled(4096), fd_floor,
                   g_pool_broker, echo.pid});
  // 2 and 64 MiB from a pool, run only when named (--only):
  // "malloc_2m_pooled" and "malloc_64m_pooled" start each round once the pool
  // is full again and no freed memory is being returned, as between bursts
  // (BM_Broker_MallocPooled), so they time the take, not the refill that the
  // last free started; "malloc_2m_pooled_sustained" takes on without waiting,
  // faster than the workers can zero new memory, so refills, returns and
  // misses run beside the pairs.
  for (auto [op, size] : {std::pair{"malloc_2m_pooled", size_t{2} << 20}, {"malloc_64m_pooled", size_t{64} << 20}})
    if (only == op)
      pairs.push_back({op, "round trip with fd + one-way message", take_pooled(size), fd_floor, g_pool_broker, echo.pid,
                       WaitForQuietPoolBroker});
  if (only == "malloc_2m_pooled_sustained")
    pairs.push_back({"malloc_2m_pooled_sustained", "round trip with fd + one-way message", take_pooled(2 << 20),
                     fd_floor, g_pool_broker, echo.pid});
  pairs.push_back({"export", "round trip",
                   [&] { (void)c.ExportToShareableHandle(*held, kExportNoPidCheck); },
                   [&] { RoundTrip(echo.fd, -1); }, g_broker, echo.pid});
  pairs.push_back({"import", "round trip with fd + one-way message",
                   [&] { (void)importer.ImportFromShareableHandle(*token); }, fd_floor, g_broker, echo.pid});
  if (!only.empty())
    std::erase_if(pairs, [&](const Pair& p) { return only != p.op; });
  auto time_us = [](const std::function<void()>& f) {
    auto t = std::chrono::steady_clock::now();
    f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t).count();
  };
  // With one pair, each server's CPU time over the whole run is that pair's.
  // (Reading it around every call instead moved where the scheduler put the
  // echo process and halved the floor: the probe changed what it measured.)
  std::map<pid_t, double> cpu_before;
  for (const Pair& p : pairs)
    for (pid_t pid : {p.op_server, p.floor_server}) cpu_before[pid] = CpuTimeUs(pid);
  for (int r = 0; r < rounds; ++r) {
    for (Pair& p : pairs) {
      if (p.before_round) p.before_round();
      if (r % 2 == 0) {
        p.floor_us.push_back(time_us(p.run_floor));
        p.op_us.push_back(time_us(p.run_op));
      } else {
        p.op_us.push_back(time_us(p.run_op));
        p.floor_us.push_back(time_us(p.run_floor));
      }
    }
  }
  auto server_cpu_per_call = [&](pid_t pid) { return (CpuTimeUs(pid) - cpu_before[pid]) / rounds; };
  ::close(memfd);
  for (const Pair& p : pairs) {
    double op50 = Percentile(p.op_us, 0.5), floor50 = Percentile(p.floor_us, 0.5);
    std::string extra;
    if (pairs.size() == 1 && !p.before_round)  // (its waits ask the broker, which counts)
      extra += ", \"op_server_cpu_us\": " + std::to_string(server_cpu_per_call(p.op_server)) +
               ", \"floor_server_cpu_us\": " + std::to_string(server_cpu_per_call(p.floor_server));
    if (std::string_view(p.op).find("_pooled") != std::string_view::npos)
      extra += ", \"pool_misses\": " + std::to_string(pool_misses);
    // The ratio of medians in each tenth of the run, in order: its spread tells a
    // tie from a loss, and a drift of the machine from noise.
    extra += ", \"block_ratios\": [";
    const size_t block = std::max<size_t>(1, p.op_us.size() / kBlocks);
    for (size_t at = 0; at + block <= p.op_us.size(); at += block) {
      std::vector<double> op(p.op_us.begin() + at, p.op_us.begin() + at + block),
          floor(p.floor_us.begin() + at, p.floor_us.begin() + at + block);
      char one[32];
      std::snprintf(one, sizeof(one), "%s%.3f", at == 0 ? "" : ", ", Percentile(op, 0.5) / Percentile(floor, 0.5));
      extra += one;
    }
    extra += "]";
    std::printf(
        "{\"bench\": \"paired\", \"placement\": \"%s\", \"op\": \"%s\", \"floor\": \"%s\", \"rounds\": %d, "
        "\"op_p50_us\": %.1f, \"op_p99_us\": %.1f, \"floor_p50_us\": %.1f, \"floor_p99_us\": %.1f, "
        "\"op_mean_us\": %.1f, \"floor_mean_us\": %.1f, \"ratio_p50\": %.3f%s}\n",
        PlacementName(placement), p.op, p.floor, rounds, op50, Percentile(p.op_us, 0.99), floor50,
        Percentile(p.floor_us, 0.99), Mean(p.op_us), Mean(p.floor_us), op50 / floor50, extra.c_str());
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string broker = MEMBROKER_BROKER_BINARY;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--broker")) broker = argv[i + 1];
  char tmpl[] = "/tmp/membroker-bench.XXXXXX";
  std::string dir = ::mkdtemp(tmpl);
  g_socket = dir + "/b.sock";
  g_pool_socket = dir + "/pool.sock";
  int paired = 0;
  Placement placement = Placement::kAny;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--only") && i + 1 < argc) only = argv[i + 1];
    if (!std::strcmp(argv[i], "--paired") && i + 1 < argc) paired = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--one-cpu")) placement = Placement::kOne;
    if (!std::strcmp(argv[i], "--cross-cpu")) placement = Placement::kCross;
  }
  // One CPU: this process, the brokers and the echo processes all on CPU 0.
  if (placement == Placement::kOne && !bench::PinToCpu0()) {
    std::perror("bench: sched_setaffinity");
    return 1;
  }
  g_broker = bench::LaunchBroker(broker, {"--socket", g_socket, "--log-level", "warn"});
  std::vector<std::string> pool_args{"--socket", g_pool_socket, "--log-level", "warn"};
  const char* pool_sizes[] = {"4K", "2M", "64M"};
  for (int i = 0; i < 3; ++i)
    pool_args.insert(pool_args.end(),
                     {"--pool", std::string(pool_sizes[i]) + ":normal:" + std::to_string(kPooledIterations[i])});
  g_pool_broker = bench::LaunchBroker(broker, pool_args);
  // Cross: the brokers' loop threads and the echo processes (forked later by
  // this process) on CPU 0, the caller later on CPU 1. Only each broker's main
  // thread is pinned: its worker threads, which refill the pools (started
  // while the pools filled), keep every CPU, as on a machine with spare cores.
  int rc = 0;
  if (placement == Placement::kCross &&
      !(bench::PinToCpu(0, g_broker) && bench::PinToCpu(0, g_pool_broker) && bench::PinToCpu(0))) {
    std::perror("bench: sched_setaffinity to CPU 0");
    rc = 1;
  } else if (paired > 0) {
    rc = RunPaired(paired, placement, only);
  } else {
    benchmark::Initialize(&argc, argv);
    benchmark::RunSpecifiedBenchmarks();
    benchmark::Shutdown();
  }
  for (pid_t pid : {g_broker, g_pool_broker}) {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
  }
  // The brokers leave their state files (never removed by a broker); then the folder goes.
  for (const std::string& socket : {g_socket, g_pool_socket}) ::unlink((socket + ".state").c_str());
  ::rmdir(dir.c_str());
  return rc;
}
