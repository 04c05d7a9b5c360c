// One Client used by many threads at once: replies reach the right caller, a
// slow request of one thread does not hold up the others. Run under TSan too.
#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "broker_process.h"
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
        auto r = client.ReserveMemAddress(4096);
        auto m = client.MapMem(r->base(), 4096, 0, *h);
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
