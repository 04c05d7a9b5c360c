// Broker restart: how long after a new broker is ready every client has
// reattached, for 1, 16, 64 and 256 client processes holding 100 allocations
// each, and the new broker's loop-thread CPU time meanwhile. The old broker is
// SIGKILLed; each client's on_reattach records the moment it finished
// (CLOCK_MONOTONIC, comparable across processes).
// Then a take-over (--take-over) under clients calling Ping in a loop: the
// longest call beside it against the longest across it, and failed calls.
//   bench_reattach --broker PATH [--quick]   -> JSON lines on stdout
#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "broker_launch.h"
#include "membroker/client.h"
#include "schedstat.h"

namespace {

int g_allocations = 100;  // per client (--allocations)

uint64_t NowNs() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

bool WriteAll(int fd, const void* p, size_t n) {
  return ::write(fd, p, n) == static_cast<ssize_t>(n);
}

bool ReadAll(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// `count` allocations of 4 KiB, held in *held.
bool Hold(membroker::Client& c, std::vector<membroker::PhysicalHandle>* held, int count) {
  for (int i = 0; i < count; ++i) {
    auto h = c.MallocPhysical(4096);
    if (!h.ok()) return false;
    held->push_back(std::move(*h));
  }
  return true;
}

// A client process: holds `allocations`, says ready, reports when it reattached,
// then waits for the parent to close `go`.
int Holder(const std::string& socket, int report_fd, int go_fd, int allocations) {
  membroker::ConnectOptions o{socket, "reattach-bench"};
  o.on_reattach = [report_fd](const membroker::ReattachReport& r) {
    // One write of 16 bytes: atomic on a pipe, whatever the other clients write.
    const uint64_t x[2] = {NowNs(), r.handles};
    (void)WriteAll(report_fd, x, sizeof(x));
  };
  auto c = membroker::Client::Connect(o);
  if (!c.ok()) return 1;
  std::vector<membroker::PhysicalHandle> held;
  if (!Hold(*c, &held, allocations)) return 2;
  const uint64_t ready[2] = {0, 0};
  if (!WriteAll(report_fd, ready, sizeof(ready))) return 3;
  char b;
  (void)::read(go_fd, &b, 1);  // EOF: the parent is done
  return 0;
}

struct Run {
  double all_ms = 0, median_ms = 0;
  double broker_cpu_ms = 0;  // the new broker's loop thread (its main thread's schedstat) until all were back
  uint64_t handles = 0;
};

Run Once(const std::string& broker, const std::string& dir, int clients, int allocations) {
  const std::string socket = dir + "/b.sock";
  std::vector<std::string> args{"--socket", socket, "--log-level", "error"};
  pid_t b = membroker::bench::LaunchBroker(broker, args);
  int report[2], go[2];
  // Close-on-exec: the broker started later must not hold them open.
  if (::pipe2(report, O_CLOEXEC) != 0 || ::pipe2(go, O_CLOEXEC) != 0) std::exit(1);
  std::vector<pid_t> kids;
  for (int i = 0; i < clients; ++i) {
    pid_t p = ::fork();
    if (p == 0) {
      ::close(report[0]);
      ::close(go[1]);
      _exit(Holder(socket, report[1], go[0], allocations));
    }
    kids.push_back(p);
  }
  ::close(report[1]);
  ::close(go[0]);
  for (int i = 0; i < clients; ++i) {
    uint64_t x[2];
    if (!ReadAll(report[0], x, sizeof(x))) {
      std::fprintf(stderr, "bench_reattach: a client failed to start\n");
      std::exit(1);
    }
  }
  ::kill(b, SIGKILL);
  ::waitpid(b, nullptr, 0);
  b = membroker::bench::LaunchBroker(broker, args);
  const uint64_t ready = NowNs();
  const std::string broker_stat = "/proc/" + std::to_string(b) + "/schedstat";
  const double cpu_at_ready = membroker::bench::ReadSchedStat(broker_stat).cpu_us;
  std::vector<double> ms;
  Run run;
  for (int i = 0; i < clients; ++i) {
    uint64_t x[2];
    if (!ReadAll(report[0], x, sizeof(x))) {
      std::fprintf(stderr, "bench_reattach: a client did not reattach\n");
      std::exit(1);
    }
    ms.push_back(x[0] > ready ? static_cast<double>(x[0] - ready) / 1e6 : 0.0);
    run.handles += x[1];
  }
  run.broker_cpu_ms = (membroker::bench::ReadSchedStat(broker_stat).cpu_us - cpu_at_ready) / 1e3;
  std::sort(ms.begin(), ms.end());
  run.all_ms = ms.back();
  run.median_ms = ms[ms.size() / 2];
  ::close(go[1]);
  for (pid_t p : kids) ::waitpid(p, nullptr, 0);
  ::close(report[0]);
  ::kill(b, SIGTERM);
  ::waitpid(b, nullptr, 0);
  return run;
}

// The take-over under load: phase 0 beside it, 1 across it, 2 stop.
struct LoopShared {
  std::atomic<int> phase{0};
  std::atomic<uint64_t> longest_us[2][8];
  std::atomic<uint64_t> calls[2][8];
  std::atomic<uint64_t> failed[8];
};

int Looper(const std::string& socket, LoopShared* shared, int index) {
  auto c = membroker::Client::Connect({socket, "takeover-bench"});
  if (!c.ok()) return 1;
  std::vector<membroker::PhysicalHandle> held;
  if (!Hold(*c, &held, g_allocations)) return 2;
  for (int phase; (phase = shared->phase.load()) < 2;) {
    const uint64_t start = NowNs();
    if (!c->Ping().ok()) ++shared->failed[index];
    const uint64_t us = (NowNs() - start) / 1000;
    if (us > shared->longest_us[phase][index]) shared->longest_us[phase][index] = us;
    ++shared->calls[phase][index];
  }
  return 0;
}

void TakeOverRun(const std::string& broker, const std::string& dir) {
  constexpr int kLoopers = 4;
  const std::string socket = dir + "/t.sock";
  std::vector<std::string> args{"--socket", socket, "--log-level", "error"};
  pid_t a = membroker::bench::LaunchBroker(broker, args);
  void* mem = ::mmap(nullptr, sizeof(LoopShared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) std::exit(1);
  auto* shared = new (mem) LoopShared();
  std::vector<pid_t> kids;
  for (int i = 0; i < kLoopers; ++i) {
    pid_t p = ::fork();
    if (p == 0) _exit(Looper(socket, shared, i));
    kids.push_back(p);
  }
  // A measured duration, not a synchronisation: each phase runs this long.
  ::usleep(500 * 1000);
  shared->phase = 1;
  std::vector<std::string> take = args;
  take.push_back("--take-over");
  pid_t b = membroker::bench::LaunchBroker(broker, take);
  int status = 0;
  ::waitpid(a, &status, 0);
  ::usleep(500 * 1000);
  shared->phase = 2;
  for (pid_t p : kids) ::waitpid(p, nullptr, 0);
  uint64_t longest[2] = {0, 0}, calls[2] = {0, 0}, failed = 0;
  for (int i = 0; i < kLoopers; ++i) {
    for (int ph = 0; ph < 2; ++ph) {
      longest[ph] = std::max<uint64_t>(longest[ph], shared->longest_us[ph][i]);
      calls[ph] += shared->calls[ph][i];
    }
    failed += shared->failed[i];
  }
  std::printf(
      "{\"bench\": \"takeover\", \"clients\": %d, \"allocations_per_client\": %d, \"old_exit\": %d, "
      "\"beside_longest_ms\": %.3f, \"across_longest_ms\": %.3f, \"beside_calls\": %llu, "
      "\"across_calls\": %llu, \"failed\": %llu}\n",
      kLoopers, g_allocations, WIFEXITED(status) ? WEXITSTATUS(status) : -1, longest[0] / 1000.0,
      longest[1] / 1000.0, static_cast<unsigned long long>(calls[0]), static_cast<unsigned long long>(calls[1]),
      static_cast<unsigned long long>(failed));
  std::fflush(stdout);
  ::kill(b, SIGTERM);
  ::waitpid(b, nullptr, 0);
  ::munmap(mem, sizeof(LoopShared));
}

}  // namespace

int main(int argc, char** argv) {
  std::string broker;
  bool quick = false;
  int only_clients = 0;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--broker") && i + 1 < argc) broker = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--allocations") && i + 1 < argc) g_allocations = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--clients") && i + 1 < argc) only_clients = std::atoi(argv[++i]);
  }
  if (broker.empty()) {
    std::fprintf(stderr, "usage: bench_reattach --broker PATH [--quick]\n");
    return 2;
  }
  char tmpl[] = "/tmp/membroker-reattach.XXXXXX";
  if (::mkdtemp(tmpl) == nullptr) return 1;
  const std::string dir = tmpl;
  const int rounds = quick ? 3 : 7;
  // The new broker holds one fd per allocation: 256 clients need 25,600 and
  // more, past many machines' default limit; raise it where allowed.
  rlimit fds{};
  if (::getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_max < 65536) {
    rlimit raised{65536, 65536};
    if (::setrlimit(RLIMIT_NOFILE, &raised) == 0) fds = raised;
  }
  for (int clients : {1, 16, 64, 256}) {
    if (only_clients != 0 && clients != only_clients) continue;
    // Where the limit is short of what the new broker would hold, fewer each (said in the line).
    const rlim_t room = fds.rlim_max > 1024 ? (fds.rlim_max - 1024) / static_cast<rlim_t>(clients) : 0;
    const int allocations = static_cast<int>(std::min<rlim_t>(static_cast<rlim_t>(g_allocations), room));
    if (allocations == 0) continue;
    std::vector<Run> runs;
    for (int r = 0; r < rounds; ++r) runs.push_back(Once(broker, dir, clients, allocations));
    std::sort(runs.begin(), runs.end(), [](const Run& a, const Run& b) { return a.all_ms < b.all_ms; });
    const Run& mid = runs[runs.size() / 2];
    std::string each;  // every round's all-reattached time, fastest first
    for (const Run& r : runs) each += (each.empty() ? "" : ", ") + std::to_string(r.all_ms);
    std::printf(
        "{\"bench\": \"reattach\", \"clients\": %d, \"allocations_per_client\": %d, \"rounds\": %d, "
        "\"all_reattached_ms\": %.3f, \"median_client_ms\": %.3f, \"broker_cpu_ms\": %.3f, \"handles\": %llu, "
        "\"fd_limit\": %llu, \"all_reattached_ms_each\": [%s]}\n",
        clients, allocations, rounds, mid.all_ms, mid.median_ms, mid.broker_cpu_ms,
        static_cast<unsigned long long>(mid.handles), static_cast<unsigned long long>(fds.rlim_max), each.c_str());
    std::fflush(stdout);
  }
  if (only_clients == 0) TakeOverRun(broker, dir);
  std::string rm = "rm -rf '" + dir + "'";
  return std::system(rm.c_str()) == 0 ? 0 : 1;
}
