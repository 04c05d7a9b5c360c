// Crash cleanup: clients killed with SIGKILL at any point leave nothing behind
// in the broker - no holdings, no allocations, no fds.
#include <unistd.h>

#include <csignal>
#include <cstring>
#include <optional>
#include <random>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

// A client that loops through every operation forever, reporting each step on
// the channel so the parent can kill it at a chosen point.
int BusyClient(const std::string& socket, Channel& ch, unsigned seed) {
  auto c = Client::Connect({socket, "busy"});
  if (!c.ok()) return 1;
  std::mt19937 rng(seed);
  std::vector<PhysicalHandle> held;
  std::vector<Mapping> maps;
  std::vector<Reservation> ranges;
  for (;;) {
    switch (rng() % 6) {
      case 0:
      case 1: {
        size_t size = (1 + rng() % 64) * 4096;
        if (rng() % 8 == 0) size = 4 << 20;  // sometimes through the worker pool
        auto h = c->MallocPhysical(size);
        if (h.ok()) held.push_back(std::move(*h));
        break;
      }
      case 2:
        if (!held.empty()) {
          auto& h = held[rng() % held.size()];
          auto r = c->ReserveMemAddress(h.size());
          auto m = c->MapMem(r->base(), h.size(), 0, h);
          if (m.ok()) {
            std::memset(m->data(), 1, 4096);
            maps.push_back(std::move(*m));
            ranges.push_back(std::move(*r));
          }
        }
        break;
      case 3:
        if (!held.empty()) {
          auto t = c->ExportToShareableHandle(held[rng() % held.size()], kExportNoPidCheck);
          (void)t;
        }
        break;
      case 4:
        if (!held.empty()) held.erase(held.begin() + rng() % held.size());
        break;
      case 5:
        if (!maps.empty()) maps.erase(maps.begin() + rng() % maps.size());
        break;
    }
    ch.Send("step");
  }
}

TEST(Crash, SigkillWhileHoldingManyAllocationsReleasesAll) {
  BrokerProcess b;
  size_t fds_before = b.FdCount();
  std::string s = b.socket();
  Channel ch;
  pid_t pid = ForkChild([&] {
    ch.AsChild();
    auto c = Client::Connect({s, "holder"});
    if (!c.ok()) return 1;
    std::vector<PhysicalHandle> held;
    for (int i = 0; i < 100; ++i) held.push_back(std::move(*c->MallocPhysical(64 << 10)));
    auto m = MapWhole(*c, held[0]);
    ch.Send("holding");
    ch.Receive();
    return 0;
  });
  ch.AsParent();
  ASSERT_EQ(ch.Receive(), "holding");
  EXPECT_EQ(b.Stat("allocations_live"), 100u);
  EXPECT_EQ(b.FdCount(), fds_before + 102);  // 100 memfds, the connection and its pidfd
  ::kill(pid, SIGKILL);
  EXPECT_EQ(WaitChild(pid), 128 + SIGKILL);
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("bytes_allocated"), 0u);
  EXPECT_EQ(b.Stat("clients_crashed"), 1u);
  EXPECT_EQ(b.Stat("released_on_disconnect"), 100u);
  EXPECT_EQ(b.WaitForStat("bytes_returning", 0), 0u);  // 6.4 MiB: closed by a worker
  EXPECT_EQ(b.FdCount(), fds_before);
}

TEST(Crash, SigkillAtRandomPointsLeavesNothingBehind) {
  BrokerProcess b;
  // A long-lived bystander: it must be served throughout and keep its memory.
  auto bystander = Client::Connect({b.socket(), "bystander"});
  ASSERT_TRUE(bystander.ok());
  auto mine = bystander->MallocPhysical(1 << 20);
  ASSERT_TRUE(mine.ok());
  ASSERT_TRUE(bystander->Ping().ok());
  size_t fds_before = b.FdCount();
  uint64_t live_before = b.Stat("allocations_live");

  std::mt19937 rng(12345);
  constexpr int kRounds = 30;
  std::string s = b.socket();
  for (int round = 0; round < kRounds; ++round) {
    Channel ch;
    unsigned seed = rng();
    pid_t pid = ForkChild([&] {
      ch.AsChild();
      return BusyClient(s, ch, seed);
    });
    ch.AsParent();
    // Kill after a random number of completed steps (0 = maybe mid-handshake).
    int steps = static_cast<int>(rng() % 200);
    for (int i = 0; i < steps; ++i)
      if (ch.Receive().empty()) break;
    ::kill(pid, SIGKILL);
    ASSERT_EQ(WaitChild(pid), 128 + SIGKILL);
  }
  EXPECT_EQ(b.WaitForStat("clients_connected", 1), 1u);  // the bystander
  EXPECT_EQ(b.WaitForStat("bytes_pending", 0), 0u);       // worker-pool allocations done
  EXPECT_EQ(b.WaitForStat("bytes_returning", 0), 0u);     // and freed large ones closed
  EXPECT_EQ(b.Stat("allocations_live"), live_before);
  EXPECT_EQ(b.Stat("bytes_allocated"), size_t{1} << 20);
  EXPECT_EQ(b.FdCount(), fds_before);
  EXPECT_TRUE(bystander->Ping().ok());
  auto again = bystander->MallocPhysical(4096);
  EXPECT_TRUE(again.ok());
}

TEST(Crash, CleanExitIsNotCountedAsACrash) {
  BrokerProcess b;
  std::string s = b.socket();
  pid_t pid = ForkChild([&] {
    auto c = Client::Connect({s, "polite"});
    auto h = c->MallocPhysical(4096);
    return h.ok() ? 0 : 1;
  });
  EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("clients_crashed"), 0u);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
}

// A session ends at its client's goodbye, not when the last copy of the
// socket closes: a child the client forked keeps a copy it cannot use.
TEST(Crash, GoodbyeEndsTheSessionWhileAForkedChildHoldsItsSocket) {
  BrokerProcess b;
  std::optional<Client> c(*Client::Connect({b.socket(), "forks"}));
  ASSERT_TRUE(c->MallocPhysical(4096).ok());
  int release[2];
  ASSERT_EQ(::pipe(release), 0);
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) {  // holds the inherited socket until told to go (or the test ends)
    char byte;
    ::close(release[1]);
    (void)!::read(release[0], &byte, 1);
    ::_exit(0);
  }
  ::close(release[0]);
  c.reset();  // goodbye
  EXPECT_EQ(b.WaitForStat("clients_connected", 0), 0u);
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("clients_crashed"), 0u);
  ::close(release[1]);
  EXPECT_EQ(WaitChild(child), 0);
}

}  // namespace
}  // namespace membroker::testing
