// The client VMM path against a real broker: reserve, map, set access, unmap,
// release; every misuse gets its error and changes nothing.
#include <sys/mman.h>

#include <cstring>
#include <atomic>
#include <csignal>
#include <thread>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"

namespace membroker::testing {
namespace {

constexpr size_t kPage = 4096;

class Vmm : public ::testing::Test {
 protected:
  void SetUp() override {
    auto c = Client::Connect({broker.socket(), "vmm-test"});
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    client = std::move(*c);
  }
  PhysicalHandle Malloc(size_t size) {
    auto h = client.MallocPhysical(size);
    EXPECT_TRUE(h.ok()) << h.status().ToString();
    return h.ok() ? std::move(*h) : PhysicalHandle();
  }
  // True if [p, p+size) is still reserved (MAP_FIXED_NOREPLACE refuses it).
  static bool StillReserved(void* p, size_t size) {
    void* r = ::mmap(p, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    if (r == p) {
      ::munmap(r, size);
      return false;
    }
    return r == MAP_FAILED && errno == EEXIST;
  }

  BrokerProcess broker;
  Client client;
};

TEST_F(Vmm, GranularityPerPolicy) {
  AllocationProp normal;
  EXPECT_EQ(*client.GetAllocationGranularity(normal, GranularityOption::kMinimum), 4096u);
  EXPECT_EQ(*client.GetAllocationGranularity(normal, GranularityOption::kRecommended), 2u << 20);
  AllocationProp huge{PagePolicy::kHugeOnly};
  EXPECT_EQ(*client.GetAllocationGranularity(huge, GranularityOption::kMinimum), 2u << 20);
  AllocationProp huge1g{PagePolicy::kHuge1GOnly};
  EXPECT_EQ(*client.GetAllocationGranularity(huge1g, GranularityOption::kMinimum), 1u << 30);
}

TEST_F(Vmm, MallocRoundsToThePageAndRejectsZero) {
  auto h = Malloc(5000);
  EXPECT_EQ(h.size(), 8192u);
  EXPECT_EQ(h.page_size(), 4096u);
  EXPECT_EQ(client.MallocPhysical(0).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(client.MallocPhysical(size_t{1} << 50).code(), ErrorCode::kParamInvalid);
}

TEST_F(Vmm, BudgetExhaustionIsAClearError) {
  BrokerProcess small({"--max-bytes", "1M"});
  auto c = Client::Connect({small.socket(), "t"});
  ASSERT_TRUE(c.ok());
  auto a = c->MallocPhysical(768 << 10);
  ASSERT_TRUE(a.ok());
  auto b = c->MallocPhysical(512 << 10);
  EXPECT_EQ(b.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(b.status().message().find("--max-bytes"), std::string::npos);
  EXPECT_TRUE(c->Ping().ok());
}

TEST_F(Vmm, MapWriteUnmapKeepsTheRangeReserved) {
  auto h = Malloc(64 * kPage);
  auto r = client.ReserveMemAddress(64 * kPage);
  ASSERT_TRUE(r.ok());
  void* base = r->base();
  {
    auto m = client.MapMem(base, 64 * kPage, 0, h);
    ASSERT_TRUE(m.ok()) << m.status().ToString();
    std::memset(m->data(), 0xab, m->size());
    Status st = client.UnmapMem(*m);
    EXPECT_TRUE(st.ok()) << st.ToString();
    EXPECT_EQ(client.UnmapMem(*m).code(), ErrorCode::kNotMapped);  // already unmapped
  }
  EXPECT_TRUE(StillReserved(base, 64 * kPage));
  // Map again: the data is still there (the handle kept the memory).
  auto m2 = client.MapMem(base, 64 * kPage, 0, h);
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->as<unsigned char>()[12345], 0xab);
}

TEST_F(Vmm, GrowABufferByMappingASecondHandleNextToTheFirst) {
  auto first = Malloc(16 * kPage);
  auto second = Malloc(16 * kPage);
  auto r = client.ReserveMemAddress(32 * kPage);
  ASSERT_TRUE(r.ok());
  auto m1 = client.MapMem(r->base(), 16 * kPage, 0, first);
  ASSERT_TRUE(m1.ok());
  std::memset(m1->data(), 1, 16 * kPage);
  auto m2 = client.MapMem(r->at(16 * kPage), 16 * kPage, 0, second);
  ASSERT_TRUE(m2.ok());
  // One contiguous buffer across both allocations; no copy was made.
  auto* bytes = static_cast<unsigned char*>(r->base());
  std::memset(bytes + 16 * kPage, 2, 16 * kPage);
  EXPECT_EQ(bytes[16 * kPage - 1], 1);
  EXPECT_EQ(bytes[16 * kPage], 2);
  // Access can be set across the boundary in one call.
  EXPECT_TRUE(client.MemSetAccess(r->base(), 32 * kPage, Access::kRead).ok());
  EXPECT_TRUE(client.MemSetAccess(r->base(), 32 * kPage, Access::kReadWrite).ok());
}

TEST_F(Vmm, PartialMappingAtAnOffset) {
  auto h = Malloc(8 * kPage);
  auto r = client.ReserveMemAddress(8 * kPage);
  ASSERT_TRUE(r.ok());
  auto whole = client.MapMem(r->base(), 8 * kPage, 0, h);
  ASSERT_TRUE(whole.ok());
  whole->as<char>()[5 * kPage] = 'x';
  auto r2 = client.ReserveMemAddress(2 * kPage);
  ASSERT_TRUE(r2.ok());
  auto part = client.MapMem(r2->base(), 2 * kPage, 5 * kPage, h);
  ASSERT_TRUE(part.ok());
  EXPECT_EQ(part->as<char>()[0], 'x');
}

TEST_F(Vmm, MisuseGetsClearErrorsAndChangesNothing) {
  auto h = Malloc(16 * kPage);
  auto r = client.ReserveMemAddress(16 * kPage);
  ASSERT_TRUE(r.ok());
  auto m = client.MapMem(r->base(), 8 * kPage, 0, h);
  ASSERT_TRUE(m.ok());
  m->as<char>()[0] = 'k';

  // Outside any reservation.
  char stack_buffer[kPage * 2];
  void* outside = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(stack_buffer) + kPage - 1) & ~(kPage - 1));
  EXPECT_EQ(client.MapMem(outside, kPage, 0, h).code(), ErrorCode::kOutOfRange);
  // Running past the reservation's end.
  EXPECT_EQ(client.MapMem(r->at(12 * kPage), 8 * kPage, 0, h).code(), ErrorCode::kOutOfRange);
  // Overlapping the existing mapping, from inside and from before.
  EXPECT_EQ(client.MapMem(r->at(4 * kPage), 4 * kPage, 0, h).code(), ErrorCode::kOverlap);
  EXPECT_EQ(client.MapMem(r->base(), kPage, 0, h).code(), ErrorCode::kOverlap);
  // Size, offset and address not multiples of the page size.
  EXPECT_EQ(client.MapMem(r->at(8 * kPage), 100, 0, h).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(client.MapMem(r->at(8 * kPage), kPage, 10, h).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(client.MapMem(r->at(8 * kPage + 1), kPage, 0, h).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(client.MapMem(r->at(8 * kPage), 0, 0, h).code(), ErrorCode::kParamInvalid);
  // Offset past the allocation's end.
  EXPECT_EQ(client.MapMem(r->at(8 * kPage), 2 * kPage, 15 * kPage, h).code(), ErrorCode::kOutOfRange);
  // Set access on a range that is not (fully) mapped.
  EXPECT_EQ(client.MemSetAccess(r->at(8 * kPage), kPage, Access::kRead).code(), ErrorCode::kNotMapped);
  EXPECT_EQ(client.MemSetAccess(r->base(), 9 * kPage, Access::kRead).code(), ErrorCode::kNotMapped);
  EXPECT_EQ(client.MemSetAccess(outside, kPage, Access::kRead).code(), ErrorCode::kNotMapped);
  // Releasing a reservation that still has a mapping.
  EXPECT_EQ(client.ReleaseMemAddress(*r).code(), ErrorCode::kBusy);
  // Bad reservations.
  EXPECT_EQ(client.ReserveMemAddress(0).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(client.ReserveMemAddress(100).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(client.ReserveMemAddress(kPage, 3 * kPage).code(), ErrorCode::kParamInvalid);

  // Nothing changed: the mapping still works and the rest is mappable.
  EXPECT_EQ(m->as<char>()[0], 'k');
  auto rest = client.MapMem(r->at(8 * kPage), 8 * kPage, 8 * kPage, h);
  EXPECT_TRUE(rest.ok()) << rest.status().ToString();
}

TEST_F(Vmm, FreedHandlesCannotBeMappedOrFreedTwice) {
  auto h = Malloc(kPage);
  auto r = client.ReserveMemAddress(kPage);
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(client.FreePhysical(h).ok());
  EXPECT_EQ(client.FreePhysical(h).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(client.MapMem(r->base(), kPage, 0, h).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(client.ExportToShareableHandle(h).code(), ErrorCode::kInvalidHandle);
  EXPECT_EQ(broker.WaitForStat("allocations_live", 0), 0u);
}

// Two Clients of one process: each call takes only its own Client's handles,
// mappings and reservations; another's is INVALID_HANDLE and changes nothing.
TEST_F(Vmm, AnotherClientsHandlesMappingsAndReservationsAreInvalidHandles) {
  Client other = *Client::Connect({broker.socket(), "other"});
  auto h = Malloc(kPage);
  auto r = client.ReserveMemAddress(kPage);
  ASSERT_TRUE(r.ok());
  auto m = client.MapMem(r->base(), kPage, 0, h);
  ASSERT_TRUE(m.ok());
  auto r2 = other.ReserveMemAddress(kPage);
  ASSERT_TRUE(r2.ok());
  auto expect_foreign = [](const Status& st) {
    EXPECT_EQ(st.code(), ErrorCode::kInvalidHandle) << st.ToString();
    EXPECT_NE(st.message().find("belongs to another Client"), std::string::npos) << st.ToString();
  };
  expect_foreign(other.ExportToShareableHandle(h).status());
  expect_foreign(other.Publish("vmm/foreign", h));
  expect_foreign(other.MapMem(r2->base(), kPage, 0, h).status());
  expect_foreign(other.UnmapMem(*m));
  expect_foreign(other.ReleaseMemAddress(*r));
  expect_foreign(other.FreePhysical(h));
  // Nothing happened: the handle, its mapping and the reservation are as they were.
  EXPECT_EQ(broker.Stat("exports_live"), 0u);
  EXPECT_FALSE(client.Lookup("vmm/foreign").ok());
  m->as<int>()[0] = 7;
  EXPECT_TRUE(client.UnmapMem(*m).ok());
  EXPECT_TRUE(client.ReleaseMemAddress(*r).ok());
  EXPECT_TRUE(client.FreePhysical(h).ok());
  EXPECT_EQ(broker.WaitForStat("allocations_live", 0), 0u);
}

TEST_F(Vmm, FreeWhileMappedIsDeferredToTheLastUnmap) {
  auto h = Malloc(kPage);
  auto r = client.ReserveMemAddress(kPage);
  ASSERT_TRUE(r.ok());
  auto m = client.MapMem(r->base(), kPage, 0, h);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(client.FreePhysical(h).ok());
  ASSERT_TRUE(client.Ping().ok());  // the broker has seen everything sent before
  EXPECT_EQ(broker.Stat("allocations_live"), 1u);  // still mapped here
  m->as<char>()[0] = 'z';
  ASSERT_TRUE(client.UnmapMem(*m).ok());
  ASSERT_TRUE(client.Ping().ok());
  EXPECT_EQ(broker.Stat("allocations_live"), 0u);
}

TEST_F(Vmm, ReleaseAfterUnmapAndRaiiCleanup) {
  {
    auto h = Malloc(4 * kPage);
    auto r = client.ReserveMemAddress(4 * kPage, 2 << 20);
    ASSERT_TRUE(r.ok());
    EXPECT_EQ(reinterpret_cast<uintptr_t>(r->base()) % (2 << 20), 0u);
    auto m = client.MapMem(r->base(), 4 * kPage, 0, h);
    ASSERT_TRUE(m.ok());
    EXPECT_TRUE(client.UnmapMem(*m).ok());
    EXPECT_TRUE(client.ReleaseMemAddress(*r).ok());
    EXPECT_EQ(client.ReleaseMemAddress(*r).code(), ErrorCode::kInvalidHandle);
  }
  {
    // Destructors do it all: mapping, reservation, handle.
    auto h = Malloc(4 * kPage);
    auto m = MapWhole(client, h);
    ASSERT_TRUE(m.ok());
  }
  ASSERT_TRUE(client.Ping().ok());
  EXPECT_EQ(broker.Stat("allocations_live"), 0u);
}

TEST_F(Vmm, ReservationDestroyedFirstLeavesMappingsEmptyNotDangling) {
  auto h = Malloc(kPage);
  Mapping m;
  {
    auto r = client.ReserveMemAddress(kPage);
    ASSERT_TRUE(r.ok());
    auto mm = client.MapMem(r->base(), kPage, 0, h);
    ASSERT_TRUE(mm.ok());
    m = std::move(*mm);
  }
  // The range is gone; unmapping the stale mapping is a clear error.
  EXPECT_EQ(client.UnmapMem(m).code(), ErrorCode::kNotMapped);
}

TEST_F(Vmm, ExpectedAddressIsHonouredWhenFree) {
  auto probe = client.ReserveMemAddress(8 * kPage);
  ASSERT_TRUE(probe.ok());
  void* where = probe->base();
  ASSERT_TRUE(client.ReleaseMemAddress(*probe).ok());
  auto r = client.ReserveMemAddress(8 * kPage, 0, where);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->base(), where);
}

TEST_F(Vmm, AccessNoneFaultsAndReadOnlyRejectsWrites) {
  auto h = Malloc(kPage);
  auto m = MapWhole(client, h);
  ASSERT_TRUE(m.ok());
  ASSERT_TRUE(client.MemSetAccess(m->data(), kPage, Access::kRead).ok());
  // A write must fault: check in a child so the fault does not end the test.
  void* p = m->data();
  // Sanitizers install their own SIGSEGV handler; the child wants the plain fault.
  pid_t pid = ForkChild([p] {
    std::signal(SIGSEGV, SIG_DFL);
    static_cast<volatile char*>(p)[0] = 1;
    return 0;
  });
  EXPECT_EQ(WaitChild(pid), 128 + SIGSEGV);
  ASSERT_TRUE(client.MemSetAccess(m->data(), kPage, Access::kNone).ok());
  pid = ForkChild([p] {
    std::signal(SIGSEGV, SIG_DFL);
    return static_cast<int>(static_cast<volatile char*>(p)[0]);
  });
  EXPECT_EQ(WaitChild(pid), 128 + SIGSEGV);
}

TEST_F(Vmm, OneClientSharedByManyThreads) {
  constexpr int kThreads = 4, kRounds = 100;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kRounds; ++i) {
        auto h = client.MallocPhysical((1 + (i % 4)) * kPage);
        if (!h.ok()) { ++failures; continue; }
        auto m = MapWhole(client, *h);
        if (!m.ok()) { ++failures; continue; }
        std::memset(m->data(), t, m->size());
        if (m->as<unsigned char>()[m->size() - 1] != t) ++failures;
        auto tok = client.ExportToShareableHandle(*h, kExportNoPidCheck);
        if (!tok.ok()) ++failures;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  ASSERT_TRUE(client.Ping().ok());
  EXPECT_EQ(broker.Stat("allocations_live"), 0u);
  EXPECT_EQ(broker.Stat("allocations_created"), uint64_t{kThreads * kRounds});
}

}  // namespace
}  // namespace membroker::testing
