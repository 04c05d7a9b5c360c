// Channel hand-off (membroker/channel.h), timed as bench_handoff and
// bench_iceoryx_handoff time theirs: the clock starts when the publisher
// holds a filled chunk and stops when the (last) subscriber has read its last
// byte. Subscribers are separate processes that wait on the channel itself
// (futex, or polling) and report over a control socket, off the clock.
//   bench_channel --socket BROKER_SOCKET [--quick] [--one-cpu | --cross-cpu | --spread] [--again]
//                 [--no-handoffs | --case WAKE:SUBSCRIBERS:BYTES]
// One JSON line per (wake, subscribers, size); then 64-byte messages per
// second, and the crash cleanup of a subscriber SIGKILLed holding every chunk.
// --again: a further round of the hand-offs and rates only (bench/run takes the
// median over rounds). --no-handoffs: the rest only. --case: that one hand-off
// only (bench/run alternates it with iceoryx's, case by case).
// --one-cpu: every process on CPU 0, one subscriber only: a wake-up is then a
// context switch, not an idle CPU woken (which costs 15-25 us on VMs that halt
// idle vCPUs; docs/BENCHMARKS.md). --cross-cpu: the publisher on CPU 0 and the
// one subscriber on CPU 1, so every hand-off crosses (unpinned, the scheduler
// puts them on one vCPU in some runs and on two in others). --spread: eight
// subscribers, subscriber i on CPU i+1 modulo the CPUs (the publisher on 0).
#include <linux/futex.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "membroker/channel.h"
#include "membroker/client.h"
#include "payload.h"

using namespace membroker;

namespace {

std::string g_socket;
const char* g_cpus = "all";
// --huge: the chunks on 2 MiB pages (kHugeOnly, so that a case that cannot
// have them fails rather than measuring normal pages under that name).
PagePolicy g_pages = PagePolicy::kNormalOnly;
const char* Method() { return g_pages == PagePolicy::kNormalOnly ? "membroker-channel" : "membroker-channel-2M"; }

// A subscriber process (or the futex floor's sleeper): see bench::PlaceSubscriber.
void PlaceSubscriber(size_t index) {
  if (!bench::PlaceSubscriber(g_cpus, index)) ::_exit(12);
}

using bench::Fill;
using bench::NowNs;
using bench::RecvLine;
using bench::SendLine;
using bench::Sum;

const char* WakeName(WakeMode w) { return w == WakeMode::kFutex ? "futex" : "poll"; }

// A subscriber process: reads every byte of every chunk, then reports when it
// finished and what it summed.
int Subscriber(int ctl, const std::string& channel, WakeMode wake, bool report_each) {
  auto c = Client::Connect({g_socket, "bench-subscriber"});
  if (!c.ok()) return 10;
  SubscribeOptions o;
  o.wake = wake;
  o.lookup_timeout_ms = 10000;
  auto sub = ChannelSubscriber::Join(*c, channel, o);
  if (!sub.ok()) return 11;
  SendLine(ctl, "joined");
  uint64_t received = 0;
  for (;;) {
    auto chunk = sub->Receive(30000);
    if (!chunk.ok()) break;  // the publisher has gone
    const uint64_t ta = NowNs();  // has the chunk
    const uint64_t sum = Sum(chunk->data, chunk->size);
    const uint64_t t1 = NowNs();
    (void)sub->Release(*chunk);
    ++received;
    if (report_each) SendLine(ctl, std::to_string(t1) + " " + std::to_string(sum) + " " + std::to_string(ta));
  }
  if (!report_each) SendLine(ctl, std::to_string(NowNs()) + " " + std::to_string(received));
  return 0;
}

struct Subscribers {
  std::vector<pid_t> pids;
  std::vector<int> ctl;
  Subscribers(size_t n, const std::string& channel, WakeMode wake, bool report_each) {
    for (size_t i = 0; i < n; ++i) {
      int sv[2];
      if (::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv) != 0) std::exit(2);
      std::fflush(stdout);
      pid_t pid = ::fork();
      if (pid == 0) {
        ::close(sv[0]);
        PlaceSubscriber(i);
        ::_exit(Subscriber(sv[1], channel, wake, report_each));
      }
      ::close(sv[1]);
      pids.push_back(pid);
      ctl.push_back(sv[0]);
    }
    // All started before any has joined, as bench_iceoryx_handoff starts its
    // consumers: where the scheduler puts each new process depends on it
    // (started one after another's join, 8 subscribers mostly ended up 5 or 6
    // on one CPU and stayed there; started together, 4 and 4, as iceoryx's).
    for (int fd : ctl)
      if (RecvLine(fd) != "joined") std::exit(3);
  }
  void Wait() {
    for (size_t i = 0; i < pids.size(); ++i) {
      ::waitpid(pids[i], nullptr, 0);
      ::close(ctl[i]);
    }
  }
};

ChannelOptions Options(size_t size, WakeMode wake) {
  ChannelOptions o;
  o.chunk_bytes = size;
  o.chunks = size >= (64 << 20) ? 4 : 16;
  o.queue_depth = 4;
  o.wake = wake;
  o.page_policy = g_pages;
  return o;
}

void HandOff(Client& c, size_t size, int iterations, WakeMode wake, size_t subscribers) {
  const std::string name = "bench/channel/" + std::to_string(size) + "/" + WakeName(wake) + "/" +
                           std::to_string(subscribers);
  auto pub = ChannelPublisher::Create(c, name, Options(size, wake));
  if (!pub.ok()) {
    std::fprintf(stderr, "channel: %s\n", pub.status().ToString().c_str());
    std::exit(4);
  }
  Subscribers subs(subscribers, name, wake, true);
  if (!pub->WaitForSubscribers(static_cast<uint32_t>(subscribers), 10000).ok()) std::exit(5);
  std::vector<double> us, wake_us, read_us;  // until the last subscriber has the chunk; the longest read
  std::string error;
  for (int i = 0; i < iterations && error.empty(); ++i) {
    auto chunk = pub->Loan(size, 10000);
    if (!chunk.ok()) {
      error = "loan: " + chunk.status().message();
      break;
    }
    Fill(chunk->data, size, static_cast<uint64_t>(i));
    const uint64_t expect = Sum(chunk->data, size);
    chunk->size = size;
    const uint64_t t0 = NowNs();
    if (Status st = pub->Publish(*chunk, 10000); !st.ok()) {
      error = "publish: " + st.message();
      break;
    }
    uint64_t last = 0, last_has = 0, longest_read = 0;
    for (int fd : subs.ctl) {
      unsigned long long t1 = 0, sum = 0, ta = 0;
      std::sscanf(RecvLine(fd).c_str(), "%llu %llu %llu", &t1, &sum, &ta);
      if (sum != expect) error = "a subscriber read wrong bytes";
      last = std::max<uint64_t>(last, t1);
      last_has = std::max<uint64_t>(last_has, ta);
      longest_read = std::max<uint64_t>(longest_read, t1 - ta);
    }
    us.push_back((last - t0) / 1000.0);
    wake_us.push_back((last_has - t0) / 1000.0);
    read_us.push_back(longest_read / 1000.0);
  }
  *pub = ChannelPublisher();
  subs.Wait();
  const double median = bench::Median(us);
  std::printf(
      "{\"bench\": \"channel\", \"method\": \"%s\", \"wake\": \"%s\", \"subscribers\": %zu, "
      "\"cpus\": \"%s\", \"size\": %zu, \"iterations\": %zu, \"median_us\": %.1f, \"gb_per_s\": %.2f, "
      "\"wake_us\": %.1f, \"read_us\": %.1f, \"error\": \"%s\"}\n",
      Method(), WakeName(wake), subscribers, g_cpus, size, us.size(), median, median > 0 ? size / median / 1e3 : 0.0,
      bench::Median(wake_us), bench::Median(read_us), error.c_str());
  std::fflush(stdout);
}

// 64-byte messages as fast as the publisher can loan and publish them.
void MessageRate(Client& c, WakeMode wake, int messages) {
  const std::string name = std::string("bench/channel/rate/") + WakeName(wake);
  ChannelOptions o;
  o.chunk_bytes = 64;
  o.chunks = 1024;
  o.queue_depth = 512;
  o.wake = wake;
  auto pub = ChannelPublisher::Create(c, name, o);
  if (!pub.ok()) std::exit(6);
  Subscribers subs(1, name, wake, false);
  if (!pub->WaitForSubscribers(1, 10000).ok()) std::exit(7);
  const uint64_t t0 = NowNs();
  for (int i = 0; i < messages; ++i) {
    auto chunk = pub->Loan(64, 10000);
    if (!chunk.ok()) std::exit(8);
    std::memcpy(chunk->data, &i, sizeof(i));
    chunk->size = 64;
    if (!pub->Publish(*chunk, 10000).ok()) std::exit(9);
  }
  *pub = ChannelPublisher();  // the subscriber drains, then reports
  unsigned long long t1 = 0, received = 0;
  std::sscanf(RecvLine(subs.ctl[0]).c_str(), "%llu %llu", &t1, &received);
  subs.Wait();
  const double seconds = (t1 - t0) / 1e9;
  std::printf("{\"bench\": \"channel_rate\", \"method\": \"membroker-channel\", \"wake\": \"%s\", \"size\": 64, "
              "\"messages\": %llu, \"per_s\": %.0f}\n",
              WakeName(wake), received, seconds > 0 ? received / seconds : 0.0);
  std::fflush(stdout);
}

// A subscriber holding every chunk is SIGKILLed: how long until the
// publisher has loaned them all again.
void CrashCleanup(Client& c) {
  constexpr uint32_t kChunks = 64;
  ChannelOptions o;
  o.chunk_bytes = 4096;
  o.chunks = kChunks;
  o.queue_depth = kChunks;
  auto pub = ChannelPublisher::Create(c, "bench/channel/crash", o);
  if (!pub.ok()) std::exit(10);
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
  std::fflush(stdout);
  pid_t victim = ::fork();
  if (victim == 0) {
    auto cc = Client::Connect({g_socket, "bench-victim"});
    auto sub = ChannelSubscriber::Join(*cc, "bench/channel/crash");
    if (!sub.ok()) ::_exit(1);
    SendLine(sv[1], "joined");
    for (uint32_t i = 0; i < kChunks; ++i)
      if (!sub->Receive(10000).ok()) ::_exit(2);
    SendLine(sv[1], "holding");
    for (;;) ::pause();
  }
  if (RecvLine(sv[0]) != "joined" || !pub->WaitForSubscribers(1, 10000).ok()) std::exit(11);
  for (uint32_t i = 0; i < kChunks; ++i) {
    auto chunk = pub->Loan(8, 1000);
    if (!chunk.ok() || !pub->Publish(*chunk, 1000).ok()) std::exit(12);
  }
  if (RecvLine(sv[0]) != "holding") std::exit(13);
  const uint64_t t0 = NowNs();
  ::kill(victim, SIGKILL);
  std::vector<Chunk> all;
  while (all.size() < kChunks) {
    auto chunk = pub->Loan(8, 10000);
    if (!chunk.ok()) std::exit(14);
    all.push_back(*chunk);
  }
  const double ms = (NowNs() - t0) / 1e6;
  ::waitpid(victim, nullptr, 0);
  std::printf("{\"bench\": \"channel_crash_cleanup\", \"chunks\": %u, \"ms\": %.2f}\n", kChunks, ms);
  std::fflush(stdout);
}

// The floor of a futex hand-off between two processes: one word in shared
// memory, the sleeper woken `gap_us` after it went to sleep (the waker
// busy-waits that long first). What a wake costs depends on how long the
// sleeping CPU has been idle: on a VM that halts idle vCPUs, bringing one
// back costs far more than a wake that comes within a microsecond or two.
void FutexFloor(int gap_us, int iterations) {
  struct Shared {
    std::atomic<uint32_t> word;
    std::atomic<uint64_t> t0;
  };
  void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) std::exit(15);
  auto* s = new (mem) Shared{};
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
  std::fflush(stdout);
  pid_t sleeper = ::fork();
  if (sleeper == 0) {
    PlaceSubscriber(0);
    uint32_t seen = 0;
    for (int i = 0; i < iterations; ++i) {
      while (s->word.load() == seen) ::syscall(SYS_futex, &s->word, FUTEX_WAIT, seen, nullptr, nullptr, 0);
      seen = s->word.load();
      const uint64_t d = NowNs() - s->t0.load();
      (void)!::send(sv[1], &d, sizeof(d), 0);
    }
    ::_exit(0);
  }
  std::vector<double> us;
  for (int i = 0; i < iterations; ++i) {
    const uint64_t until = NowNs() + static_cast<uint64_t>(gap_us) * 1000;
    while (NowNs() < until) {
    }
    s->t0.store(NowNs());
    s->word.fetch_add(1);
    ::syscall(SYS_futex, &s->word, FUTEX_WAKE, 1, nullptr, nullptr, 0);
    uint64_t d = 0;
    if (::recv(sv[0], &d, sizeof(d), 0) != sizeof(d)) std::exit(16);
    us.push_back(d / 1000.0);
  }
  ::waitpid(sleeper, nullptr, 0);
  ::close(sv[0]);
  ::close(sv[1]);
  ::munmap(mem, 4096);
  std::printf(
      "{\"bench\": \"futex_floor\", \"cpus\": \"%s\", \"gap_us\": %d, \"iterations\": %d, "
      "\"median_us\": %.1f}\n",
      g_cpus, gap_us, iterations, bench::Median(us));
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false, one_cpu = false, cross_cpu = false, spread = false, again = false, handoffs = true;
  bench::HandOffCase only;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--again")) again = true;
    if (!std::strcmp(argv[i], "--no-handoffs")) handoffs = false;
    if (!std::strcmp(argv[i], "--case") && (i + 1 >= argc || !bench::HandOffCase::Parse(argv[++i], &only))) {
      std::fprintf(stderr, "--case WAKE:SUBSCRIBERS:BYTES, WAKE futex or poll\n");
      return 2;
    }
    if (!std::strcmp(argv[i], "--socket") && i + 1 < argc) g_socket = argv[++i];
    else if (!std::strcmp(argv[i], "--quick")) quick = true;
    else if (!std::strcmp(argv[i], "--one-cpu")) one_cpu = true;
    else if (!std::strcmp(argv[i], "--cross-cpu")) cross_cpu = true;
    else if (!std::strcmp(argv[i], "--spread")) spread = true;
    else if (!std::strcmp(argv[i], "--huge")) g_pages = PagePolicy::kHugeOnly;
  }
  const bool placed = one_cpu || cross_cpu || spread;  // one subscriber only; --spread: eight
  if (placed) {
    if (!bench::PinToCpu0()) return 2;
    g_cpus = one_cpu ? "one" : cross_cpu ? "cross" : "spread";
  }
  if (g_socket.empty()) {
    std::fprintf(stderr, "usage: bench_channel --socket BROKER_SOCKET [--quick] [--one-cpu | --cross-cpu | --spread]\n");
    return 2;
  }
  ::signal(SIGPIPE, SIG_IGN);
  auto c = Client::Connect({g_socket, "bench-publisher"});
  if (!c.ok()) {
    std::fprintf(stderr, "%s\n", c.status().ToString().c_str());
    return 1;
  }
  if (only.size != 0) {
    HandOff(*c, only.size, bench::HandOffIterations(only.size, quick),
            only.wake == "poll" ? WakeMode::kPoll : WakeMode::kFutex, only.subscribers);
    return 0;
  }
  if (handoffs)
    for (WakeMode wake : {WakeMode::kFutex, WakeMode::kPoll})
      for (size_t subscribers : {size_t{1}, size_t{8}})
        for (size_t size : {size_t{4} << 10, size_t{1} << 20, size_t{64} << 20})
          if (!placed || subscribers == (spread ? 8 : 1))
            HandOff(*c, size, bench::HandOffIterations(size, quick), wake, subscribers);
  if (!again && !spread)
    for (int gap_us : {0, 20}) FutexFloor(gap_us, quick ? 500 : 5000);
  if (placed) return 0;
  for (WakeMode wake : {WakeMode::kFutex, WakeMode::kPoll}) MessageRate(*c, wake, quick ? 50000 : 500000);
  if (!again) CrashCleanup(*c);
  return 0;
}
