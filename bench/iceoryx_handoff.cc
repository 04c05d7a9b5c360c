// The iceoryx peer for bench_handoff: zero-copy publish/subscribe through
// RouDi's shared memory, timed the way bench_handoff times every method - the
// clock starts when the producer holds a filled buffer (a loaned chunk) and
// stops when the consumer has read its last byte. A control socket wakes the
// consumer, as it does for the other methods. RouDi must be running with a
// config whose mempools fit the sizes (bench/iceoryx_roudi.toml).
//   bench_iceoryx_handoff [--quick]
// Prints one JSON line per size, in bench_handoff's format (method "iceoryx"),
// then RouDi's crash cleanup: a publisher holding every 4 KiB chunk is killed
// with SIGKILL; the time until another process can loan them all again.
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "iceoryx_posh/popo/untyped_publisher.hpp"
#include "iceoryx_posh/popo/untyped_subscriber.hpp"
#include "iceoryx_posh/runtime/posh_runtime.hpp"

namespace {

uint64_t NowNs() {
  timespec ts{};
  ::clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000ull + ts.tv_nsec;
}

void Fill(void* p, size_t n, int seed) {
  auto* b = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < n / 8; ++i) b[i] = i * 0x9e3779b97f4a7c15ull + seed;
}
uint64_t Sum(const void* p, size_t n) {
  const auto* b = static_cast<const uint64_t*>(p);
  uint64_t s = 0;
  for (size_t i = 0; i < n / 8; ++i) s += b[i];
  return s;
}

void SendLine(int fd, const std::string& s) { (void)!::send(fd, s.data(), s.size(), MSG_NOSIGNAL); }
std::string RecvLine(int fd) {
  char buf[256];
  ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
  return n > 0 ? std::string(buf, n) : std::string();
}

iox::capro::ServiceDescription Service(size_t size) {
  return {"membroker", "bench", iox::capro::IdString_t(iox::cxx::TruncateToCapacity, std::to_string(size).c_str())};
}

int Consumer(int ctl, size_t size) {
  std::string name = "mb-consumer-" + std::to_string(size);
  iox::runtime::PoshRuntime::initRuntime(iox::RuntimeName_t(iox::cxx::TruncateToCapacity, name.c_str()));
  iox::popo::UntypedSubscriber sub(Service(size));
  for (;;) {
    if (RecvLine(ctl).empty()) return 0;
    const void* chunk = nullptr;
    while (chunk == nullptr) {  // published before the wake-up: present at once
      sub.take().and_then([&](const void* c) { chunk = c; });
      if (chunk == nullptr) std::this_thread::yield();
    }
    uint64_t sum = Sum(chunk, size);
    uint64_t t1 = NowNs();
    sub.release(chunk);
    SendLine(ctl, std::to_string(t1) + " " + std::to_string(sum));
  }
}

int Producer(int ctl, size_t size, int iterations) {
  std::string name = "mb-producer-" + std::to_string(size);
  iox::runtime::PoshRuntime::initRuntime(iox::RuntimeName_t(iox::cxx::TruncateToCapacity, name.c_str()));
  iox::popo::UntypedPublisher pub(Service(size));
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (!pub.hasSubscribers()) {  // discovery through RouDi
    if (std::chrono::steady_clock::now() > deadline) {
      std::printf("{\"bench\": \"handoff\", \"method\": \"iceoryx\", \"pages\": \"4K\", \"size\": %zu, "
                  "\"iterations\": 0, \"median_us\": 0, \"gb_per_s\": 0, \"error\": \"no subscriber\"}\n",
                  size);
      return 1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::vector<double> us;
  std::string error;
  for (int i = 0; i < iterations && error.empty(); ++i) {
    void* chunk = nullptr;
    pub.loan(size).and_then([&](void* c) { chunk = c; }).or_else([&](auto) { error = "loan failed"; });
    if (chunk == nullptr) break;
    Fill(chunk, size, i);
    uint64_t expect = Sum(chunk, size);
    uint64_t t0 = NowNs();
    pub.publish(chunk);
    SendLine(ctl, "go");
    std::string done = RecvLine(ctl);
    unsigned long long t1 = 0, sum = 0;
    std::sscanf(done.c_str(), "%llu %llu", &t1, &sum);
    if (sum != expect) error = "the consumer read wrong bytes";
    us.push_back((t1 - t0) / 1000.0);
  }
  std::sort(us.begin(), us.end());
  double median = us.empty() ? 0 : us[us.size() / 2];
  std::printf("{\"bench\": \"handoff\", \"method\": \"iceoryx\", \"pages\": \"4K\", \"size\": %zu, "
              "\"iterations\": %zu, \"median_us\": %.1f, \"gb_per_s\": %.2f, \"error\": \"%s\"}\n",
              size, us.size(), median, median > 0 ? size / median / 1e3 : 0.0, error.c_str());
  std::fflush(stdout);
  return error.empty() ? 0 : 1;
}

// RouDi's side of the crash-cleanup benchmark (bench_load measures membroker's).
int CrashCleanup() {
  int victim_ctl[2], prober_ctl[2];
  ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, victim_ctl);
  ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, prober_ctl);
  constexpr size_t kChunk = 4096;
  auto loan_all = [](iox::popo::UntypedPublisher& pub, std::vector<void*>* held) {
    for (;;) {
      void* c = nullptr;
      pub.loan(kChunk).and_then([&](void* p) { c = p; });
      if (c == nullptr) return;
      held->push_back(c);
    }
  };
  std::fflush(stdout);
  pid_t victim = ::fork();
  if (victim == 0) {
    iox::runtime::PoshRuntime::initRuntime("mb-victim");
    iox::popo::UntypedPublisher pub({"membroker", "bench", "crash"});
    std::vector<void*> held;
    loan_all(pub, &held);
    SendLine(victim_ctl[1], std::to_string(held.size()));
    for (;;) ::pause();  // killed here, holding every chunk
  }
  pid_t prober = ::fork();
  if (prober == 0) {
    iox::runtime::PoshRuntime::initRuntime("mb-prober");
    iox::popo::UntypedPublisher pub({"membroker", "bench", "crash-probe"});
    size_t want = std::stoul(RecvLine(prober_ctl[1]));
    unsigned long long t0 = std::stoull(RecvLine(prober_ctl[1]));
    std::vector<void*> held;
    for (;;) {
      loan_all(pub, &held);
      if (held.size() >= want) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    double ms = (NowNs() - t0) / 1e6;
    for (void* c : held) pub.release(c);
    std::printf("{\"bench\": \"iceoryx_crash_cleanup\", \"chunks\": %zu, \"ms\": %.1f}\n", want, ms);
    std::fflush(stdout);
    std::exit(0);
  }
  std::string held = RecvLine(victim_ctl[0]);
  SendLine(prober_ctl[0], held);
  uint64_t t0 = NowNs();
  ::kill(victim, SIGKILL);
  SendLine(prober_ctl[0], std::to_string(t0));
  ::waitpid(victim, nullptr, 0);
  int status = 0;
  ::waitpid(prober, &status, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = argc > 1 && !std::strcmp(argv[1], "--quick");
  struct Case {
    size_t size;
    int iterations;
  };
  // 1 GiB is left out: RouDi would have to reserve it in /dev/shm up front.
  std::vector<Case> cases = {{4 << 10, quick ? 200 : 2000}, {1 << 20, quick ? 40 : 400}, {64 << 20, quick ? 5 : 30}};
  int rc = 0;
  for (const Case& c : cases) {
    int ctl[2];
    ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, ctl);
    std::fflush(stdout);
    // Both sides are fresh processes: an iceoryx runtime is one per process.
    pid_t consumer = ::fork();
    if (consumer == 0) {
      ::close(ctl[0]);
      std::exit(Consumer(ctl[1], c.size));  // exit, not _exit: the runtime unregisters
    }
    pid_t producer = ::fork();
    if (producer == 0) {
      ::close(ctl[1]);
      std::exit(Producer(ctl[0], c.size, c.iterations));
    }
    ::close(ctl[0]);
    ::close(ctl[1]);
    int status = 0;
    ::waitpid(producer, &status, 0);
    rc |= !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    ::waitpid(consumer, nullptr, 0);  // its control socket closed: it returns
  }
  rc |= CrashCleanup();
  return rc;
}
