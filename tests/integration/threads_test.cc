// One Client used by many threads at once: replies reach the right caller, a
// slow request of one thread does not hold up the others. Run under TSan too.
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <future>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

TEST(Threads, ConcurrentCallsOnOneConnection) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "threads"});
  ASSERT_TRUE(c.ok());
  Client& client = *c;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  // One thread makes large allocations (served by the broker's worker pool)...
  threads.emplace_back([&] {
    for (int i = 0; i < 5; ++i) {
      auto h = client.MallocPhysical(32 << 20);
      if (!h.ok() || h->size() != (32u << 20)) ++failures;
    }
  });
  // ...while others run small round trips and local VMM calls.
  for (int t = 0; t < 3; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        if (!client.Ping().ok()) ++failures;
        auto h = client.MallocPhysical(4096);
        if (!h.ok()) {
          ++failures;
          continue;
        }
        auto m = MapWhole(client, *h);
        if (!m.ok()) {
          ++failures;
          continue;
        }
        m->as<int>()[0] = t;
        if (!client.MemSetAccess(m->data(), 4096, Access::kRead).ok()) ++failures;
        if (m->as<int>()[0] != t) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_TRUE(client.Ping().ok());
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(client.async_errors(), 0u);
}

// No broker I/O happens under the client's lock: a thread whose Free blocks
// on a broker that does not read (SIGSTOPped, its socket full) holds up no
// other thread's local call. Map, SetAccess and Unmap are system calls; with
// the Free sent under the lock they waited until the broker read again.
TEST(Threads, ABlockedFreeDoesNotHoldUpLocalCalls) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "threads"});
  ASSERT_TRUE(c.ok());
  Client& client = *c;
  // Enough frees to fill the socket's buffer many times over.
  std::vector<PhysicalHandle> many;
  for (int i = 0; i < 4000; ++i) {
    auto h = client.MallocPhysical(4096);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    many.push_back(std::move(*h));
  }
  auto mine = client.MallocPhysical(4096);
  ASSERT_TRUE(mine.ok());
  auto r = client.ReserveMemAddress(4096);
  ASSERT_TRUE(r.ok());

  ASSERT_EQ(::kill(b.pid(), SIGSTOP), 0);
  std::atomic<pid_t> freer_tid{0};
  std::atomic<size_t> freed{0};
  std::thread freer([&] {
    freer_tid = static_cast<pid_t>(::syscall(SYS_gettid));
    for (auto& h : many) {
      (void)client.FreePhysical(h);
      ++freed;
    }
  });
  // Wait (bounded) until the freer sleeps in sendmsg with frees left: the broker reads nothing.
  auto in_sendmsg = [&] {
    const pid_t tid = freer_tid.load();
    if (tid == 0) return false;
    std::ifstream sc("/proc/self/task/" + std::to_string(tid) + "/syscall");
    long nr = -1;
    return static_cast<bool>(sc >> nr) && nr == SYS_sendmsg;
  };
  bool blocked = false;
  for (int i = 0; i < 60000 && !blocked && freed.load() < many.size(); ++i) {
    blocked = in_sendmsg();
    if (!blocked) std::this_thread::yield();
  }
  if (!blocked) {
    ::kill(b.pid(), SIGCONT);
    freer.join();
    GTEST_SKIP() << "the socket never filled (" << freed.load() << " frees sent)";
  }
  // Local calls go on while the freer is stuck.
  auto local = std::async(std::launch::async, [&] {
    auto m = client.MapMem(r->base(), 4096, 0, *mine);
    if (!m.ok()) return m.status();
    m->as<int>()[0] = 7;
    MB_RETURN_IF_ERROR(client.MemSetAccess(m->data(), 4096, Access::kRead));
    return client.UnmapMem(*m);
  });
  const bool done = local.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  const bool still_blocked = freed.load() < many.size();
  ASSERT_EQ(::kill(b.pid(), SIGCONT), 0);
  freer.join();
  EXPECT_TRUE(still_blocked);
  EXPECT_TRUE(done) << "a local call waited for the broker to read a Free";
  if (done) {
    EXPECT_TRUE(local.get().ok());
  }
  many.clear();
  EXPECT_TRUE(client.FreePhysical(*mine).ok());
  EXPECT_TRUE(client.Ping().ok());
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
}

TEST(Threads, HandlesMovedBetweenThreads) {
  BrokerProcess b;
  auto c = Client::Connect({b.socket(), "mover"});
  ASSERT_TRUE(c.ok());
  std::vector<PhysicalHandle> made;
  for (int i = 0; i < 50; ++i) made.push_back(std::move(*c->MallocPhysical(4096)));
  std::thread consumer([handles = std::move(made)]() mutable { handles.clear(); });
  consumer.join();
  ASSERT_TRUE(c->Ping().ok());
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
}

}  // namespace
}  // namespace membroker::testing
