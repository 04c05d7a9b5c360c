// Load on the broker, measured against peers in the same run:
//   throughput    N client processes in closed loops of small requests (Ping),
//                 against a minimal SEQPACKET echo server driven the same way
//   head-of-line  p99 of small requests from 8 clients, idle and while another
//                 client creates 1 GiB allocations in a loop
//   cleanup       SIGKILL a client holding N allocations; time until the broker
//                 reports them all released (polled on the admin socket)
//   scale         broker RSS per idle client and per allocation; Ping latency
//                 with many live allocations against an empty broker
//   load --broker PATH_TO_membrokerd [--quick]
// Prints one JSON object per measurement line.
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "broker_launch.h"
#include "membroker/client.h"
#include "membroker/ipc/admin_client.h"
#include "membroker/ipc/protocol.h"
#include "schedstat.h"

using namespace membroker;
using Clock = std::chrono::steady_clock;

namespace {

std::string g_binary, g_dir;

struct Broker {
  pid_t pid = -1;
  std::string socket, admin;
  Broker() {
    socket = g_dir + "/b.sock";
    admin = g_dir + "/b.admin";
    pid = bench::LaunchBroker(g_binary, {"--socket", socket, "--admin-socket", admin, "--log-level", "error",
                                         "--max-clients", "4096"});
  }
  ~Broker() {
    ::kill(pid, SIGTERM);
    ::waitpid(pid, nullptr, 0);
  }
  std::string StatsJson() const {
    auto reply = ipc::AskAdmin(admin, "stats --json");
    return reply.ok() ? *reply : "";
  }
  // One numeric field of a `stats --json` answer.
  static uint64_t Field(const std::string& json, const std::string& key) {
    std::string k = "\"" + key + "\": ";
    size_t at = json.find(k);
    return at == std::string::npos ? UINT64_MAX : std::strtoull(json.c_str() + at + k.size(), nullptr, 10);
  }
};

// The peer: one process, poll() over every connection, echo each datagram.
pid_t StartEchoServer(const std::string& path) {
  int lfd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  ::unlink(path.c_str());
  if (::bind(lfd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 || ::listen(lfd, 4096) != 0) std::exit(1);
  pid_t pid = ::fork();
  if (pid == 0) {
    std::vector<pollfd> fds{{lfd, POLLIN, 0}};
    char buf[4096];
    for (;;) {
      ::poll(fds.data(), fds.size(), -1);
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        ssize_t n = ::recv(fds[i].fd, buf, sizeof(buf), MSG_DONTWAIT);
        if (n > 0) ::send(fds[i].fd, buf, static_cast<size_t>(n), MSG_NOSIGNAL);
        else if (n == 0) { ::close(fds[i].fd); fds[i].fd = -1; }
      }
      if (fds[0].revents & POLLIN)
        for (int c; (c = ::accept4(lfd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0 && fds.size() < 5000;) {
          fds.push_back({c, POLLIN, 0});
          if (::poll(&fds[0], 1, 0) <= 0) break;
        }
      fds.erase(std::remove_if(fds.begin() + 1, fds.end(), [](const pollfd& p) { return p.fd < 0; }), fds.end());
    }
  }
  ::close(lfd);
  return pid;
}

// The broker's threads as the scheduler saw them: the loop thread is the main
// one, the rest are libuv's workers.
struct ThreadTimes {
  double loop_wait_us = 0, worker_cpu_us = 0;
};
ThreadTimes BrokerThreadTimes(pid_t pid) {
  ThreadTimes t;
  std::string dir = "/proc/" + std::to_string(pid) + "/task";
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return t;
  while (dirent* e = ::readdir(d)) {
    if (e->d_name[0] == '.') continue;
    bench::SchedStat st = bench::ReadSchedStat(dir + "/" + e->d_name + "/schedstat");
    if (std::atoi(e->d_name) == pid)
      t.loop_wait_us = st.wait_us;
    else
      t.worker_cpu_us += st.cpu_us;
  }
  ::closedir(d);
  return t;
}

// Runs `clients` processes doing `op` in a closed loop for `seconds`; returns
// requests per second, the p50 and p99 latency in µs (from every client's
// samples), and the CPU time per request of the clients (their loops only)
// and of the server (`server`'s main thread, over the whole run): on two
// vCPUs shared by both, requests/s follow the sum.
struct LoadResult {
  double rps = 0, p50_us = 0, p99_us = 0, client_cpu_us = 0, server_cpu_us = 0;
};
double CpuUs() {
  timespec t{};
  ::clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}
template <typename Op>
LoadResult ClosedLoop(int clients, double seconds, pid_t server, Op make_op) {
  int go[2];
  if (::pipe(go) != 0) std::exit(1);
  std::vector<pid_t> pids;
  for (int c = 0; c < clients; ++c) {
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(go[1]);
      auto op = make_op();
      char b;
      (void)!::read(go[0], &b, 1);  // everyone starts together
      std::vector<float> lat;
      const double cpu_before = CpuUs();
      auto end = Clock::now() + std::chrono::duration<double>(seconds);
      for (auto t = Clock::now(); t < end;) {
        op();
        auto t2 = Clock::now();
        lat.push_back(std::chrono::duration<float, std::micro>(t2 - t).count());
        t = t2;
      }
      const double cpu_us = CpuUs() - cpu_before;
      // Report the count, the loop's CPU time and a sample of latencies (at most 2000).
      std::sort(lat.begin(), lat.end());
      std::string line = std::to_string(lat.size()) + ' ' + std::to_string(cpu_us);
      size_t step = std::max<size_t>(1, lat.size() / 2000);
      for (size_t i = 0; i < lat.size(); i += step) {
        line += ' ';
        line += std::to_string(lat[i]);
      }
      line += "\n";
      // One file per client: lines this long would interleave in a shared pipe.
      FILE* f = std::fopen((g_dir + "/out." + std::to_string(c)).c_str(), "w");
      std::fputs(line.c_str(), f);
      std::fclose(f);
      _exit(0);
    }
    pids.push_back(pid);
  }
  const std::string server_stat = "/proc/" + std::to_string(server) + "/schedstat";
  const double server_before = bench::ReadSchedStat(server_stat).cpu_us;
  ::close(go[0]);
  ::close(go[1]);  // EOF: go
  for (pid_t p : pids) ::waitpid(p, nullptr, 0);
  const double server_us = bench::ReadSchedStat(server_stat).cpu_us - server_before;
  std::string all;
  for (int c = 0; c < clients; ++c) {
    std::string path = g_dir + "/out." + std::to_string(c);
    if (FILE* f = std::fopen(path.c_str(), "r")) {
      char buf[65536];
      for (size_t n; (n = std::fread(buf, 1, sizeof(buf), f)) > 0;) all.append(buf, n);
      std::fclose(f);
      ::unlink(path.c_str());
    }
  }
  uint64_t total = 0;
  double client_us = 0;
  std::vector<float> lat;
  size_t pos = 0;
  while (pos < all.size()) {
    size_t nl = all.find('\n', pos);
    std::string line = all.substr(pos, nl - pos);
    pos = nl + 1;
    char* p = line.data();
    total += std::strtoull(p, &p, 10);
    client_us += std::strtod(p, &p);
    while (*p) lat.push_back(std::strtof(p, &p));
  }
  std::sort(lat.begin(), lat.end());
  LoadResult r;
  r.rps = total / seconds;
  if (total > 0) {
    r.client_cpu_us = client_us / total;
    r.server_cpu_us = server_us / total;
  }
  if (!lat.empty()) {
    r.p50_us = lat[lat.size() / 2];
    r.p99_us = lat[std::min(lat.size() - 1, lat.size() * 99 / 100)];
  }
  return r;
}

// A SEQPACKET connection to `path`; exits the client process if it fails.
int ConnectSeqpacket(const std::string& path) {
  int fd = ::socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  std::strncpy(a.sun_path, path.c_str(), sizeof(a.sun_path) - 1);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) _exit(1);
  return fd;
}

struct EchoOp {
  int fd;
  std::vector<uint8_t> frame;
  void operator()() {
    char buf[256];
    if (::send(fd, frame.data(), frame.size(), 0) <= 0 || ::recv(fd, buf, sizeof(buf), 0) <= 0) {
      std::fprintf(stderr, "load: the echo server dropped a client\n");
      _exit(1);
    }
  }
};

// A broker client with no library: a hello, then one encoded Ping sent again
// and again, its reply read into a plain buffer. The broker does all it does
// for a library client; the client does what the echo server's clients do.
EchoOp ConnectRaw(const std::string& path) {
  int fd = ConnectSeqpacket(path);
  const std::vector<uint8_t> hello = ipc::Encode({ipc::kProtocolVersion, 1, 0, ipc::HelloRequest{"load-raw"}});
  char reply[4096];
  if (::send(fd, hello.data(), hello.size(), 0) <= 0 || ::recv(fd, reply, sizeof(reply), 0) <= 0) _exit(1);
  return EchoOp{fd, ipc::Encode({ipc::kProtocolVersion, 2, 0, ipc::PingRequest{}})};
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--broker") && i + 1 < argc) g_binary = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
  }
  if (g_binary.empty()) {
    std::fprintf(stderr, "usage: load --broker PATH_TO_membrokerd [--quick]\n");
    return 2;
  }
  // The broker and the clients hold one fd per allocation and per import (the
  // scale run keeps 100,000 live): raise the limit as far as we may.
  rlimit rl{};
  ::getrlimit(RLIMIT_NOFILE, &rl);
  rlimit want{262144, 262144};
  if (rl.rlim_max >= want.rlim_max || ::setrlimit(RLIMIT_NOFILE, &want) != 0) {
    rl.rlim_cur = rl.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &rl);
  }
  ::getrlimit(RLIMIT_NOFILE, &rl);
  char tmpl[] = "/tmp/membroker-load.XXXXXX";
  g_dir = ::mkdtemp(tmpl);
  const double secs = quick ? 0.7 : 3.0;

  // 1. Throughput: broker Ping against the echo server, same frame size.
  {
    Broker b;
    std::string echo_path = g_dir + "/echo.sock";
    pid_t echo = StartEchoServer(echo_path);
    // Rounds of the two, in turns (the broker first in the first, third, ...): a drift of
    // the machine moves both sides of a round alike, and the spread of the
    // rounds' ratios tells a tie from a loss.
    const int rounds = quick ? 3 : 5;
    for (int n : {1, 4, 16, 64, 256}) {
      auto run_broker = [&] {
        return ClosedLoop(n, secs, b.pid, [&] {
          auto c = Client::Connect({b.socket, "load"});
          if (!c.ok()) {
            std::fprintf(stderr, "load: %s\n", c.status().ToString().c_str());
            _exit(1);
          }
          auto shared = std::make_shared<Client>(std::move(*c));
          return [shared] { (void)shared->Ping(); };
        });
      };
      auto run_echo = [&] {
        return ClosedLoop(n, secs, echo, [&] {
          return EchoOp{ConnectSeqpacket(echo_path), std::vector<uint8_t>(48, 1)};
        });
      };
      // The broker again, its clients without the library: how much of the
      // difference is the client's.
      auto run_raw = [&] { return ClosedLoop(n, secs, b.pid, [&] { return ConnectRaw(b.socket); }); };
      std::vector<LoadResult> broker, peer, raw;
      for (int r = 0; r < rounds; ++r) {
        if (r % 2 == 0) {
          broker.push_back(run_broker());
          raw.push_back(run_raw());
          peer.push_back(run_echo());
        } else {
          peer.push_back(run_echo());
          raw.push_back(run_raw());
          broker.push_back(run_broker());
        }
      }
      auto median = [](std::vector<double> v) {
        std::sort(v.begin(), v.end());
        return v[v.size() / 2];
      };
      auto of = [&](const std::vector<LoadResult>& v, double LoadResult::*field) {
        std::vector<double> out;
        for (const LoadResult& x : v) out.push_back(x.*field);
        return out;
      };
      std::string p99_ratios, rps_ratios;
      std::vector<double> p99_each;
      for (int r = 0; r < rounds; ++r) {
        p99_each.push_back(broker[r].p99_us / peer[r].p99_us);
        char one[48];
        std::snprintf(one, sizeof(one), "%s%.3f", r == 0 ? "" : ", ", p99_each.back());
        p99_ratios += one;
        std::snprintf(one, sizeof(one), "%s%.3f", r == 0 ? "" : ", ", broker[r].rps / peer[r].rps);
        rps_ratios += one;
      }
      std::printf(
          "{\"bench\": \"throughput\", \"clients\": %d, \"rounds\": %d, \"broker_rps\": %.0f, "
          "\"broker_p50_us\": %.1f, \"broker_p99_us\": %.1f, \"echo_rps\": %.0f, \"echo_p50_us\": %.1f, "
          "\"echo_p99_us\": %.1f, \"p99_ratio\": %.3f, \"p99_ratios\": [%s], \"rps_ratios\": [%s], "
          "\"broker_client_cpu_us\": %.2f, \"broker_server_cpu_us\": %.2f, \"echo_client_cpu_us\": %.2f, "
          "\"echo_server_cpu_us\": %.2f, \"raw_rps\": %.0f, \"raw_p99_us\": %.1f, \"raw_client_cpu_us\": %.2f, "
          "\"raw_server_cpu_us\": %.2f}\n",
          n, rounds, median(of(broker, &LoadResult::rps)), median(of(broker, &LoadResult::p50_us)),
          median(of(broker, &LoadResult::p99_us)), median(of(peer, &LoadResult::rps)),
          median(of(peer, &LoadResult::p50_us)), median(of(peer, &LoadResult::p99_us)), median(p99_each),
          p99_ratios.c_str(), rps_ratios.c_str(), median(of(broker, &LoadResult::client_cpu_us)),
          median(of(broker, &LoadResult::server_cpu_us)), median(of(peer, &LoadResult::client_cpu_us)),
          median(of(peer, &LoadResult::server_cpu_us)), median(of(raw, &LoadResult::rps)),
          median(of(raw, &LoadResult::p99_us)), median(of(raw, &LoadResult::client_cpu_us)),
          median(of(raw, &LoadResult::server_cpu_us)));
      std::fflush(stdout);
    }
    ::kill(echo, SIGKILL);
    ::waitpid(echo, nullptr, 0);
  }

  // 2. Head-of-line: 8 pinging clients, idle and beside a 1 GiB allocator,
  // in rounds of the two in turns (idle first in the first, third, ...), as
  // the throughput above: the p99 ratio is the median of the rounds' own.
  {
    Broker b;
    auto pinger = [&] {
      auto c = std::make_shared<Client>(std::move(*Client::Connect({b.socket, "hol"})));
      return [c] { (void)c->Ping(); };
    };
    struct Side {
      std::vector<double> p50, p99, loop_wait_us, worker_cpus;
    } idle, busy;
    auto run = [&](bool beside_allocations) {
      pid_t big = -1;
      if (beside_allocations) {
        big = ::fork();
        if (big == 0) {
          auto c = Client::Connect({b.socket, "allocator"});
          for (;;) (void)c->MallocPhysical(size_t{1} << 30);
        }
      }
      ThreadTimes before = BrokerThreadTimes(b.pid);
      LoadResult r = ClosedLoop(8, secs, b.pid, pinger);
      ThreadTimes after = BrokerThreadTimes(b.pid);
      if (big > 0) {
        ::kill(big, SIGKILL);
        ::waitpid(big, nullptr, 0);
      }
      // Per request: how long the loop thread waited for a CPU; and how many
      // of the CPUs the worker threads used meanwhile.
      Side& side = beside_allocations ? busy : idle;
      side.p50.push_back(r.p50_us);
      side.p99.push_back(r.p99_us);
      side.loop_wait_us.push_back((after.loop_wait_us - before.loop_wait_us) / std::max(1.0, r.rps * secs));
      side.worker_cpus.push_back((after.worker_cpu_us - before.worker_cpu_us) / (secs * 1e6));
    };
    const int rounds = quick ? 3 : 5;
    for (int r = 0; r < rounds; ++r) {
      run(r % 2 != 0);
      run(r % 2 == 0);
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::vector<double> ratios;
    std::string listed;
    for (int r = 0; r < rounds; ++r) {
      ratios.push_back(busy.p99[r] / idle.p99[r]);
      char one[32];
      std::snprintf(one, sizeof(one), "%s%.3f", r == 0 ? "" : ", ", ratios.back());
      listed += one;
    }
    std::printf("{\"bench\": \"head_of_line\", \"rounds\": %d, \"idle_p50_us\": %.1f, \"idle_p99_us\": %.1f, "
                "\"busy_p50_us\": %.1f, \"busy_p99_us\": %.1f, \"idle_loop_wait_us\": %.2f, "
                "\"busy_loop_wait_us\": %.2f, \"busy_worker_cpus\": %.2f, \"p99_ratio\": %.3f, "
                "\"p99_ratios\": [%s]}\n",
                rounds, median(idle.p50), median(idle.p99), median(busy.p50), median(busy.p99),
                median(idle.loop_wait_us), median(busy.loop_wait_us), median(busy.worker_cpus), median(ratios),
                listed.c_str());
    std::fflush(stdout);
  }

  // 3. Crash cleanup: SIGKILL a client holding N allocations of its own and M
  // imports of buffers a surviving client exported.
  {
    Broker b;
    auto survivor = std::move(*Client::Connect({b.socket, "survivor"}));
    // 10,000 allocations plus 10,000 imports would need more fds than this
    // machine's hard limit (20,000, not raisable without CAP_SYS_RESOURCE) lets
    // the broker or the client hold, so the largest mixed case is 5,000 + 5,000.
    const std::pair<int, int> cases[] = {{1, 1}, {100, 100}, {5000, 5000}, {10000, 0}};
    for (auto [n, imports] : cases) {
      int reps = n >= 5000 ? (quick ? 3 : 10) : (quick ? 20 : 100);
      std::vector<PhysicalHandle> exported;
      std::vector<std::string> tokens;
      for (int i = 0; i < imports; ++i) {
        exported.push_back(std::move(*survivor.MallocPhysical(4096)));
        tokens.push_back(*survivor.ExportToShareableHandle(exported.back(), kExportNoPidCheck));
      }
      const uint64_t survivor_allocations = exported.size();
      std::vector<double> ms, exit_ms, returned_ms;
      for (int r = 0; r < reps; ++r) {
        int ready[2];
        if (::pipe(ready) != 0) return 1;
        pid_t pid = ::fork();
        if (pid == 0) {
          ::close(ready[0]);
          auto c = Client::Connect({b.socket, "doomed"});
          std::vector<PhysicalHandle> held;
          for (int i = 0; i < n; ++i) held.push_back(std::move(*c->MallocPhysical(4096)));
          for (const std::string& t : tokens) held.push_back(std::move(*c->ImportFromShareableHandle(t)));
          (void)c->Ping();
          (void)!::write(ready[1], "r", 1);
          ::pause();
          _exit(0);
        }
        ::close(ready[1]);
        char ch;
        (void)!::read(ready[0], &ch, 1);
        ::close(ready[0]);
        // The pidfd turns readable when the process has exited (before it is
        // reaped): that splits the time into the kernel's exit and the broker's work.
        int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
        auto t0 = Clock::now();
        ::kill(pid, SIGKILL);
        pollfd pfd{pidfd, POLLIN, 0};
        if (pidfd >= 0) ::poll(&pfd, 1, -1);
        auto exited = Clock::now();
        // The session closes in one step: its allocations and its imports go together.
        for (std::string stats;
             stats = b.StatsJson(), Broker::Field(stats, "allocations_live") != survivor_allocations ||
                                        Broker::Field(stats, "clients_connected") != 1;) {
        }
        ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        exit_ms.push_back(std::chrono::duration<double, std::milli>(exited - t0).count());
        // The pages go back to the kernel on a worker after that (bytes_returning).
        while (Broker::Field(b.StatsJson(), "bytes_returning") != 0) {
        }
        returned_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        if (pidfd >= 0) ::close(pidfd);
        ::waitpid(pid, nullptr, 0);
      }
      // The kernel's floor for giving the pages back: closing n fresh 4 KiB memfds.
      std::vector<int> memfds;
      for (int i = 0; i < n; ++i) {
        int fd = ::memfd_create("floor", MFD_CLOEXEC);
        (void)!::ftruncate(fd, 4096);
        (void)!::fallocate(fd, 0, 0, 4096);
        memfds.push_back(fd);
      }
      auto c0 = Clock::now();
      for (int fd : memfds) ::close(fd);
      const double close_floor_ms = std::chrono::duration<double, std::milli>(Clock::now() - c0).count();
      std::sort(ms.begin(), ms.end());
      std::sort(exit_ms.begin(), exit_ms.end());
      std::sort(returned_ms.begin(), returned_ms.end());
      auto p99 = [](const std::vector<double>& v) { return v[std::min(v.size() - 1, v.size() * 99 / 100)]; };
      std::printf("{\"bench\": \"crash_cleanup\", \"allocations\": %d, \"imports\": %d, \"runs\": %zu, \"p50_ms\": %.3f, "
                  "\"p99_ms\": %.3f, \"exit_p50_ms\": %.3f, \"exit_p99_ms\": %.3f, \"returned_p50_ms\": %.3f, "
                  "\"returned_p99_ms\": %.3f, \"close_floor_ms\": %.3f}\n",
                  n, imports, ms.size(), ms[ms.size() / 2], p99(ms), exit_ms[exit_ms.size() / 2], p99(exit_ms),
                  returned_ms[returned_ms.size() / 2], p99(returned_ms), close_floor_ms);
      std::fflush(stdout);
    }
  }
  // 4. Scale: broker memory per idle client and per allocation, and request
  // latency with many live allocations against an empty broker.
  {
    const int clients = 1000;
    // One memfd per allocation in the broker: the fd limit caps the count.
    const int allocations = static_cast<int>(std::min<rlim_t>(100000, rl.rlim_cur - 2000));
    Broker b;
    auto rss = [&] {
      std::ifstream in("/proc/" + std::to_string(b.pid) + "/status");
      for (std::string line; std::getline(in, line);)
        if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;
      return 0ull;
    };
    auto ping_latency = [&](Client& c) {
      std::vector<double> us;
      for (int i = 0; i < 2000; ++i) {
        auto t = Clock::now();
        (void)c.Ping();
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
      }
      std::sort(us.begin(), us.end());
      return std::pair{us[us.size() / 2], us[us.size() * 99 / 100]};
    };
    // A request that touches the allocation table: MallocPhysical of 4 KiB (the
    // handle goes at once, a one-way free).
    auto malloc_latency = [&](Client& c) {
      std::vector<double> us;
      for (int i = 0; i < 2000; ++i) {
        auto t = Clock::now();
        (void)c.MallocPhysical(4096);
        us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
      }
      std::sort(us.begin(), us.end());
      return std::pair{us[us.size() / 2], us[us.size() * 99 / 100]};
    };
    auto probe = std::move(*Client::Connect({b.socket, "probe"}));
    // Warm-up, discarded: the first requests pay for page faults and cold caches.
    (void)ping_latency(probe);
    (void)malloc_latency(probe);
    auto [empty_p50, empty_p99] = ping_latency(probe);
    auto [empty_malloc_p50, empty_malloc_p99] = malloc_latency(probe);
    uint64_t base = rss();
    std::vector<Client> idle;
    for (int i = 0; i < clients; ++i) idle.push_back(std::move(*Client::Connect({b.socket, "idle"})));
    (void)probe.Ping();
    uint64_t with_clients = rss();
    idle.clear();
    (void)probe.Ping();
    uint64_t before_allocs = rss();
    std::vector<PhysicalHandle> held;
    held.reserve(allocations);
    for (int i = 0; i < allocations; ++i) {
      auto h = probe.MallocPhysical(4096);
      if (!h.ok()) break;
      held.push_back(std::move(*h));
    }
    uint64_t with_allocs = rss();
    auto [full_p50, full_p99] = ping_latency(probe);
    auto [full_malloc_p50, full_malloc_p99] = malloc_latency(probe);
    const size_t live = held.size();
    held.clear();
    (void)probe.Ping();  // the frees have been served
    // Empty again: a second empty measurement after the full one, so order and
    // drift show up as a difference between the two empty figures.
    auto [after_p50, after_p99] = ping_latency(probe);
    auto [after_malloc_p50, after_malloc_p99] = malloc_latency(probe);
    std::printf("{\"bench\": \"scale\", \"fd_limit\": %llu, \"clients\": %d, \"bytes_per_idle_client\": %.0f, "
                "\"allocations\": %zu, \"bytes_per_allocation\": %.0f, \"empty_p50_us\": %.1f, "
                "\"empty_p99_us\": %.1f, \"full_p50_us\": %.1f, \"full_p99_us\": %.1f, "
                "\"after_p50_us\": %.1f, \"after_p99_us\": %.1f, \"empty_malloc_p50_us\": %.1f, "
                "\"empty_malloc_p99_us\": %.1f, \"full_malloc_p50_us\": %.1f, \"full_malloc_p99_us\": %.1f, "
                "\"after_malloc_p50_us\": %.1f, \"after_malloc_p99_us\": %.1f}\n",
                static_cast<unsigned long long>(rl.rlim_cur), clients, (with_clients - base) / double(clients), live,
                live == 0 ? 0.0 : (with_allocs - before_allocs) / double(live), empty_p50, empty_p99,
                full_p50, full_p99, after_p50, after_p99, empty_malloc_p50, empty_malloc_p99,
                full_malloc_p50, full_malloc_p99, after_malloc_p50, after_malloc_p99);
    std::fflush(stdout);
  }
  std::string rm = "rm -rf '" + g_dir + "'";
  (void)!std::system(rm.c_str());
  return 0;
}
