// The iceoryx peer for bench_handoff: zero-copy publish/subscribe through
// RouDi's shared memory, timed the way bench_handoff times every method - the
// clock starts when the producer holds a filled buffer (a loaned chunk) and
// stops when the consumer has read its last byte. A control socket wakes the
// consumer, as it does for the other methods. RouDi must be running with a
// config whose mempools fit the sizes (bench/iceoryx_roudi.toml).
//   bench_iceoryx_handoff [--quick] [--one-cpu | --cross-cpu | --spread] [--again]
//                         [--no-handoffs | --case WAKE:SUBSCRIBERS:BYTES]   (as bench_channel's)
// Prints one JSON line per size, in bench_handoff's format (method "iceoryx"),
// then, for bench_channel's table, the same hand-off with the subscribers
// waking the way channels do - polling take(), or blocking in a WaitSet
// (iceoryx's futex-backed wait) - for one subscriber and eight, then RouDi's
// crash cleanup: a publisher holding every 4 KiB chunk is killed with SIGKILL;
// the time until another process can loan them all again.
#include <poll.h>
#include <sched.h>
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

#include "iceoryx_posh/popo/publisher_options.hpp"
#include "iceoryx_posh/popo/subscriber_options.hpp"
#include "iceoryx_posh/popo/untyped_publisher.hpp"
#include "iceoryx_posh/popo/untyped_subscriber.hpp"
#include "iceoryx_posh/popo/wait_set.hpp"
#include "iceoryx_posh/runtime/posh_runtime.hpp"
#include "payload.h"

namespace {

using membroker::bench::Fill;
using membroker::bench::NowNs;
using membroker::bench::RecvLine;
using membroker::bench::SendLine;
using membroker::bench::Sum;

iox::capro::ServiceDescription Service(size_t size) {
  return {"membroker", "bench", iox::capro::IdString_t(iox::cxx::TruncateToCapacity, std::to_string(size).c_str())};
}

const char* g_cpus = "all";

// How a subscriber waits for the next chunk: told over the control socket
// (bench_handoff's table, as its other methods are), spinning on take(), or
// in a WaitSet (bench_channel's table).
enum class Wake { kSocket, kPoll, kWaitSet };
const char* WakeName(Wake w) { return w == Wake::kPoll ? "poll" : w == Wake::kWaitSet ? "futex" : "socket"; }

int WakingConsumer(int ctl, size_t size, Wake wake, int index) {
  std::string name = "mb-sub-" + std::to_string(size) + "-" + WakeName(wake) + "-" + std::to_string(index);
  iox::runtime::PoshRuntime::initRuntime(iox::RuntimeName_t(iox::cxx::TruncateToCapacity, name.c_str()));
  iox::popo::UntypedSubscriber sub(Service(size));
  iox::popo::WaitSet<> waitset;
  if (wake == Wake::kWaitSet && waitset.attachState(sub, iox::popo::SubscriberState::HAS_DATA).has_error()) return 2;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (sub.getSubscriptionState() != iox::SubscribeState::SUBSCRIBED) {
    if (std::chrono::steady_clock::now() > deadline) return 3;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  SendLine(ctl, "joined");
  for (;;) {
    if (wake == Wake::kSocket && RecvLine(ctl).empty()) return 0;  // "go", or done
    const void* chunk = nullptr;
    for (uint32_t spins = 1; chunk == nullptr; ++spins) {
      sub.take().and_then([&](const void* c) { chunk = c; });
      if (chunk != nullptr) break;
      if (wake == Wake::kWaitSet) (void)waitset.timedWait(iox::units::Duration::fromMilliseconds(100));
      else if (spins % 256 == 0) sched_yield();  // as a polling channel subscriber does
      pollfd p{ctl, POLLIN, 0};
      // The producer closed the control socket: done (checked now and then while spinning).
      if ((wake == Wake::kWaitSet || (wake == Wake::kPoll && spins % 1024 == 0)) && ::poll(&p, 1, 0) == 1) return 0;
    }
    const uint64_t ta = NowNs();  // has the chunk
    uint64_t sum = Sum(chunk, size);
    uint64_t t1 = NowNs();
    sub.release(chunk);
    SendLine(ctl, std::to_string(t1) + " " + std::to_string(sum) + " " + std::to_string(ta));
  }
}

int WakingProducer(const std::vector<int>& ctls, size_t size, int iterations, Wake wake) {
  std::string name = "mb-pub-" + std::to_string(size) + "-" + WakeName(wake) + "-" + std::to_string(ctls.size());
  iox::runtime::PoshRuntime::initRuntime(iox::RuntimeName_t(iox::cxx::TruncateToCapacity, name.c_str()));
  iox::popo::UntypedPublisher pub(Service(size));
  for (int fd : ctls)
    if (RecvLine(fd) != "joined") return 1;
  std::vector<double> us, wake_us, read_us;  // until the last subscriber has the chunk; the longest read
  std::string error;
  for (int i = 0; i < iterations && error.empty(); ++i) {
    void* chunk = nullptr;
    pub.loan(size).and_then([&](void* c) { chunk = c; }).or_else([&](auto) { error = "loan failed"; });
    if (chunk == nullptr) break;
    Fill(chunk, size, i);
    uint64_t expect = Sum(chunk, size);
    uint64_t t0 = NowNs();
    pub.publish(chunk);
    if (wake == Wake::kSocket)
      for (int fd : ctls) SendLine(fd, "go");
    uint64_t last = 0, last_has = 0, longest_read = 0;
    for (int fd : ctls) {
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
  const double median = membroker::bench::Median(us);
  if (wake == Wake::kSocket) {  // a line of bench_handoff's table
    std::printf("{\"bench\": \"handoff\", \"method\": \"iceoryx\", \"pages\": \"4K\", \"size\": %zu, "
                "\"iterations\": %zu, \"median_us\": %.1f, \"gb_per_s\": %.2f, \"error\": \"%s\"}\n",
                size, us.size(), median, median > 0 ? size / median / 1e3 : 0.0, error.c_str());
  } else {
    std::printf(
        "{\"bench\": \"channel\", \"method\": \"iceoryx\", \"wake\": \"%s\", \"subscribers\": %zu, "
        "\"cpus\": \"%s\", \"size\": %zu, \"iterations\": %zu, \"median_us\": %.1f, \"gb_per_s\": %.2f, "
        "\"wake_us\": %.1f, \"read_us\": %.1f, \"error\": \"%s\"}\n",
        WakeName(wake), ctls.size(), g_cpus, size, us.size(), median, median > 0 ? size / median / 1e3 : 0.0,
        membroker::bench::Median(wake_us), membroker::bench::Median(read_us), error.c_str());
  }
  std::fflush(stdout);
  return error.empty() ? 0 : 1;
}

// 64-byte messages per second, as bench_channel's channel_rate: the publisher
// blocks while the subscriber's queue is full (nothing dropped), the
// subscriber takes them all (polling, or in a WaitSet).
int MessageRate(Wake wake, int messages) {
  int sv[2];
  ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
  const iox::capro::ServiceDescription service{"membroker", "bench", "rate"};
  std::fflush(stdout);
  pid_t consumer = ::fork();
  if (consumer == 0) {
    ::close(sv[0]);
    iox::runtime::PoshRuntime::initRuntime(iox::RuntimeName_t(iox::cxx::TruncateToCapacity,
                                                             (std::string("mb-rate-sub-") + WakeName(wake)).c_str()));
    iox::popo::SubscriberOptions o;
    o.queueCapacity = 256;
    o.queueFullPolicy = iox::popo::QueueFullPolicy::BLOCK_PRODUCER;
    iox::popo::UntypedSubscriber sub(service, o);
    iox::popo::WaitSet<> waitset;
    if (wake == Wake::kWaitSet && waitset.attachState(sub, iox::popo::SubscriberState::HAS_DATA).has_error()) std::exit(2);
    while (sub.getSubscriptionState() != iox::SubscribeState::SUBSCRIBED)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    SendLine(sv[1], "joined");
    int received = 0;
    for (uint32_t spins = 1; received < messages; ++spins) {
      const void* chunk = nullptr;
      sub.take().and_then([&](const void* c) { chunk = c; });
      if (chunk != nullptr) {
        ++received;
        sub.release(chunk);
        continue;
      }
      if (wake == Wake::kWaitSet) (void)waitset.timedWait(iox::units::Duration::fromMilliseconds(100));
      else if (spins % 256 == 0) sched_yield();
    }
    SendLine(sv[1], std::to_string(NowNs()));
    std::exit(0);
  }
  ::close(sv[1]);
  pid_t producer = ::fork();
  if (producer == 0) {
    iox::runtime::PoshRuntime::initRuntime(iox::RuntimeName_t(iox::cxx::TruncateToCapacity,
                                                             (std::string("mb-rate-pub-") + WakeName(wake)).c_str()));
    iox::popo::PublisherOptions o;
    o.subscriberTooSlowPolicy = iox::popo::ConsumerTooSlowPolicy::WAIT_FOR_CONSUMER;
    iox::popo::UntypedPublisher pub(service, o);
    if (RecvLine(sv[0]) != "joined") std::exit(3);
    const uint64_t t0 = NowNs();
    for (int i = 0; i < messages; ++i) {
      void* chunk = nullptr;
      while (chunk == nullptr) pub.loan(64).and_then([&](void* c) { chunk = c; });
      std::memcpy(chunk, &i, sizeof(i));
      pub.publish(chunk);
    }
    const uint64_t t1 = std::stoull(RecvLine(sv[0]));
    std::printf("{\"bench\": \"channel_rate\", \"method\": \"iceoryx\", \"wake\": \"%s\", \"size\": 64, "
                "\"messages\": %d, \"per_s\": %.0f}\n", WakeName(wake), messages, messages / ((t1 - t0) / 1e9));
    std::fflush(stdout);
    std::exit(0);
  }
  int status = 0;
  ::waitpid(producer, &status, 0);
  ::waitpid(consumer, nullptr, 0);
  ::close(sv[0]);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

// One case of the channel table: `subscribers` consumers and a producer, all
// fresh processes (an iceoryx runtime is one per process).
int WakingCase(size_t size, int iterations, Wake wake, size_t subscribers) {
  std::vector<int> producer_ends;
  std::vector<pid_t> consumers;
  for (size_t i = 0; i < subscribers; ++i) {
    int sv[2];
    ::socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sv);
    std::fflush(stdout);
    pid_t pid = ::fork();
    if (pid == 0) {
      ::close(sv[0]);
      // Placed (--cross-cpu, --spread) as bench_channel places its subscribers;
      // the producer, as everything else, on CPU 0.
      if (!membroker::bench::PlaceSubscriber(g_cpus, i)) std::exit(12);
      std::exit(WakingConsumer(sv[1], size, wake, static_cast<int>(i)));
    }
    ::close(sv[1]);
    consumers.push_back(pid);
    producer_ends.push_back(sv[0]);
  }
  std::fflush(stdout);
  pid_t producer = ::fork();
  if (producer == 0) std::exit(WakingProducer(producer_ends, size, iterations, wake));
  int status = 0;
  ::waitpid(producer, &status, 0);
  for (int fd : producer_ends) ::close(fd);  // the consumers see it and exit
  for (pid_t pid : consumers) ::waitpid(pid, nullptr, 0);
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
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
  bool quick = false, one_cpu = false, cross_cpu = false, spread = false, again = false, handoffs = true;
  membroker::bench::HandOffCase only;
  for (int i = 1; i < argc; ++i) {
    again |= !std::strcmp(argv[i], "--again");
    handoffs &= std::strcmp(argv[i], "--no-handoffs") != 0;
    if (!std::strcmp(argv[i], "--case") &&
        (i + 1 >= argc || !membroker::bench::HandOffCase::Parse(argv[++i], &only))) {
      std::fprintf(stderr, "--case WAKE:SUBSCRIBERS:BYTES, WAKE futex or poll\n");
      return 2;
    }
    quick |= !std::strcmp(argv[i], "--quick");
    one_cpu |= !std::strcmp(argv[i], "--one-cpu");
    cross_cpu |= !std::strcmp(argv[i], "--cross-cpu");
    spread |= !std::strcmp(argv[i], "--spread");
  }
  // 1 GiB is left out: RouDi would have to reserve it in /dev/shm up front.
  const std::vector<size_t> sizes = {size_t{4} << 10, size_t{1} << 20, size_t{64} << 20};
  auto iterations = [&](size_t size) { return membroker::bench::HandOffIterations(size, quick); };
  int rc = 0;
  if (one_cpu || cross_cpu || spread) {  // one subscriber only; --spread: eight
    if (!membroker::bench::PinToCpu0()) return 2;
    g_cpus = one_cpu ? "one" : cross_cpu ? "cross" : "spread";
  }
  if (only.size != 0)
    return WakingCase(only.size, iterations(only.size), only.wake == "poll" ? Wake::kPoll : Wake::kWaitSet,
                      only.subscribers);
  if (one_cpu || cross_cpu || spread) {
    if (handoffs)
      for (Wake wake : {Wake::kWaitSet, Wake::kPoll})
        for (size_t size : sizes) rc |= WakingCase(size, iterations(size), wake, spread ? 8 : 1);
    return rc;
  }
  if (!again)
    for (size_t size : sizes) rc |= WakingCase(size, iterations(size), Wake::kSocket, 1);
  if (handoffs)
    for (Wake wake : {Wake::kWaitSet, Wake::kPoll})
      for (size_t subscribers : {size_t{1}, size_t{8}})
        for (size_t size : sizes) rc |= WakingCase(size, iterations(size), wake, subscribers);
  for (Wake wake : {Wake::kWaitSet, Wake::kPoll}) rc |= MessageRate(wake, quick ? 50000 : 500000);
  if (!again) rc |= CrashCleanup();
  return rc;
}
