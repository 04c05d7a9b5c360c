// Memory semantics against the real broker: pinned memory, host register,
// same-address mappings, pools, quotas, pre-faulting (huge pages: hugepage_test.cc).
#include <sys/mman.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <thread>
#include <chrono>

#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"
#include "proc_status.h"

namespace membroker::testing {
namespace {

constexpr size_t kPage = 4096;

Client ConnectOrDie(const BrokerProcess& b, const char* name = "memory-test") {
  auto c = Client::Connect({b.socket(), name});
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : Client();
}

// ---- pinned memory ------------------------------------------------------------

TEST(Pinned, BrokerLocksThePagesAndCountsThem) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  uint64_t locked_before = LockedBytes(b.pid());
  AllocationProp prop;
  prop.pinned = true;
  auto h = c.MallocPhysical(1 << 20, prop);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  EXPECT_TRUE(h->pinned());
  if (kMlockObservable) {
    EXPECT_EQ(LockedBytes(b.pid()), locked_before + (1 << 20));
  }
  EXPECT_EQ(b.Stat("pinned_bytes"), 1u << 20);
  // Pinned memory is shared like any allocation.
  auto token = c.ExportToShareableHandle(*h, kExportNoPidCheck);
  ASSERT_TRUE(token.ok());
  std::string s = b.socket(), t = *token;
  pid_t pid = ForkChild([&] {
    auto other = Client::Connect({s, "pinned-importer"});
    auto imported = other->ImportFromShareableHandle(t);
    return imported.ok() && imported->pinned() ? 0 : 1;
  });
  EXPECT_EQ(WaitChild(pid), 0);
  ASSERT_TRUE(c.FreePhysical(*h).ok());
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("pinned_bytes"), 0u);
  if (kMlockObservable) {
    EXPECT_EQ(LockedBytes(b.pid()), locked_before);
  }
}

TEST(Pinned, BudgetIsEnforcedWithAClearError) {
  BrokerProcess b({"--max-pinned-bytes", "1M"});
  Client c = ConnectOrDie(b);
  auto first = c.MallocHost(768 << 10);
  ASSERT_TRUE(first.ok()) << first.status().ToString();
  auto second = c.MallocHost(512 << 10);
  EXPECT_EQ(second.code(), ErrorCode::kResourceExhausted);
  EXPECT_NE(second.status().message().find("--max-pinned-bytes"), std::string::npos)
      << second.status().message();
  EXPECT_EQ(b.Stat("pinned_budget"), 1u << 20);
  // Unpinned memory is not limited by the pinned budget.
  EXPECT_TRUE(c.MallocPhysical(512 << 10).ok());
  ASSERT_TRUE(c.FreeHost(*first).ok());
  EXPECT_TRUE(c.MallocHost(512 << 10).ok());
}

TEST(Pinned, MallocHostAndFreeHost) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  auto p = c.MallocHost(100000);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  // Pre-faulted and writable.
  MappingInfo info = SmapsOf(*p);
  ASSERT_TRUE(info.found);
  EXPECT_EQ(info.rss, 102400u);
  std::memset(*p, 0x5a, 100000);
  EXPECT_EQ(b.Stat("pinned_bytes"), 102400u);
  EXPECT_TRUE(c.FreeHost(*p).ok());
  EXPECT_EQ(c.FreeHost(*p).code(), ErrorCode::kInvalidHandle);
  int local = 0;
  EXPECT_EQ(c.FreeHost(&local).code(), ErrorCode::kInvalidHandle);
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("pinned_bytes"), 0u);
}

// ---- host register ------------------------------------------------------------

TEST(HostRegister, PinsOwnMemoryAndIsRecorded) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  void* buf = std::aligned_alloc(kPage, 16 * kPage);
  ASSERT_NE(buf, nullptr);
  std::memset(buf, 1, 16 * kPage);
  uint64_t locked_before = LockedBytes(::getpid());
  ASSERT_TRUE(c.HostRegister(buf, 16 * kPage).ok());
  if (kMlockObservable) {
    EXPECT_GE(LockedBytes(::getpid()), locked_before + 16 * kPage);
  }
  EXPECT_EQ(b.Stat("host_registered_bytes"), 16 * kPage);
  EXPECT_EQ(b.Stat("pinned_bytes"), 16 * kPage);
  // Overlaps, misalignment, unknown flags: clear errors, nothing changes.
  EXPECT_EQ(c.HostRegister(static_cast<char*>(buf) + 4 * kPage, kPage).code(), ErrorCode::kOverlap);
  EXPECT_EQ(c.HostRegister(static_cast<char*>(buf) + 1, kPage).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(c.HostRegister(buf, 100).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(c.HostRegister(nullptr, kPage).code(), ErrorCode::kParamInvalid);
  EXPECT_EQ(b.Stat("host_registered_bytes"), 16 * kPage);
  ASSERT_TRUE(c.HostUnregister(buf).ok());
  EXPECT_EQ(c.HostUnregister(buf).code(), ErrorCode::kNotFound);
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("host_registered_bytes"), 0u);
  EXPECT_EQ(b.Stat("pinned_bytes"), 0u);
  std::free(buf);
}

TEST(HostRegister, UnmappedMemoryIsRefusedAndUncharged) {
  if (!kMlockObservable) GTEST_SKIP() << "mlock is a no-op under AddressSanitizer";
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  void* hole = ::mmap(nullptr, 4 * kPage, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ::munmap(hole, 4 * kPage);
  EXPECT_EQ(c.HostRegister(hole, 4 * kPage).code(), ErrorCode::kParamInvalid);
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("host_registered_bytes"), 0u);
}

TEST(HostRegister, CountsAgainstThePinnedBudgetAndGoesWithACrash) {
  BrokerProcess b({"--max-pinned-bytes", "64K"});
  std::string s = b.socket();
  Channel ch;
  pid_t pid = ForkChild([&] {
    ch.AsChild();
    auto c = Client::Connect({s, "registrar"});
    void* buf = std::aligned_alloc(kPage, 32 * kPage);
    std::memset(buf, 0, 32 * kPage);
    if (!c->HostRegister(buf, 8 * kPage).ok()) return 1;
    if (c->HostRegister(static_cast<char*>(buf) + 16 * kPage, 16 * kPage).code() !=
        ErrorCode::kResourceExhausted)
      return 2;
    ch.Send("registered");
    ch.Receive();
    return 0;
  });
  ch.AsParent();
  ASSERT_EQ(ch.Receive(), "registered");
  EXPECT_EQ(b.Stat("host_registered_bytes"), 8 * kPage);
  ::kill(pid, SIGKILL);
  WaitChild(pid);
  EXPECT_EQ(b.WaitForStat("host_registered_bytes", 0), 0u);
  EXPECT_EQ(b.Stat("pinned_bytes"), 0u);
}

// ---- same-address mappings ------------------------------------------------------

struct Node {
  Node* next;
  int value;
};

TEST(SameAddress, RawPointersInsideStayValidInAnotherProcess) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  AllocationProp prop;
  prop.same_address = true;
  auto h = c.MallocPhysical(64 * kPage, prop);
  ASSERT_TRUE(h.ok()) << h.status().ToString();
  ASSERT_NE(h->fixed_address(), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(h->fixed_address()) % (2 << 20), 0u);
  // Mapping anywhere else is refused.
  auto elsewhere = c.ReserveMemAddress(h->size());
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ(c.MapMem(elsewhere->base(), h->size(), 0, *h).code(), ErrorCode::kParamInvalid);
  auto r = c.ReserveMemAddress(h->size(), 0, h->fixed_address(), kReserveFixed);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  auto m = c.MapMem(r->base(), h->size(), 0, *h);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  // A linked list with raw pointers.
  Node* nodes = m->as<Node>();
  for (int i = 0; i < 100; ++i) nodes[i] = Node{i + 1 < 100 ? &nodes[i + 1] : nullptr, i * 3};
  auto token = c.ExportToShareableHandle(*h, kExportNoPidCheck);
  ASSERT_TRUE(token.ok());
  std::string s = b.socket(), t = *token;
  pid_t pid = ForkChild([&] {
    // A fresh process image would not have the parent's mapping; drop ours.
    ::munmap(h->fixed_address(), h->size());
    auto other = Client::Connect({s, "pointer-chaser"});
    auto imported = other->ImportFromShareableHandle(t);
    if (!imported.ok() || imported->fixed_address() != h->fixed_address()) return 1;
    auto rr = other->ReserveMemAddress(imported->size(), 0, imported->fixed_address(), kReserveFixed);
    if (!rr.ok()) return 2;
    auto mm = other->MapMem(rr->base(), imported->size(), 0, *imported);
    if (!mm.ok()) return 3;
    int sum = 0, count = 0;
    for (const Node* n = mm->as<Node>(); n != nullptr; n = n->next) sum += n->value, ++count;
    return count == 100 && sum == 3 * 4950 ? 0 : 4;
  });
  EXPECT_EQ(WaitChild(pid), 0);
  EXPECT_EQ(b.Stat("same_address_bytes"), 64 * kPage);
}

TEST(SameAddress, TakenRangeIsAClearErrorNotADifferentAddress) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  AllocationProp prop;
  prop.same_address = true;
  auto h = c.MallocPhysical(2 << 20, prop);
  ASSERT_TRUE(h.ok());
  // Something else already lives at that address in this process.
  void* squatter = ::mmap(h->fixed_address(), kPage, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  ASSERT_EQ(squatter, h->fixed_address());
  auto r = c.ReserveMemAddress(h->size(), 0, h->fixed_address(), kReserveFixed);
  EXPECT_EQ(r.code(), ErrorCode::kAddressInUse);
  ::munmap(squatter, kPage);
}

TEST(SameAddress, AddressesAreDistinctAndReturnedOnFree) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  AllocationProp prop;
  prop.same_address = true;
  auto a = c.MallocPhysical(4 << 20, prop);
  auto d = c.MallocPhysical(4 << 20, prop);
  ASSERT_TRUE(a.ok() && d.ok());
  auto lo = reinterpret_cast<uintptr_t>(a->fixed_address()), hi = reinterpret_cast<uintptr_t>(d->fixed_address());
  EXPECT_TRUE(lo + (4 << 20) <= hi || hi + (4 << 20) <= lo);
  EXPECT_EQ(b.Stat("same_address_bytes"), 8u << 20);
  *a = PhysicalHandle();
  *d = PhysicalHandle();
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("same_address_bytes"), 0u);
}

// ---- pools ------------------------------------------------------------------------

TEST(Pools, PooledSizesAreServedFromReadyMemoryAndRefilled) {
  BrokerProcess b({"--pool", "64K:normal:4"});
  std::string pools = b.Admin("list pools --json");
  EXPECT_NE(pools.find("\"ready\": 4"), std::string::npos) << pools;
  Client c = ConnectOrDie(b);
  std::vector<PhysicalHandle> held;
  for (int i = 0; i < 4; ++i) {
    auto h = c.MallocPhysical(65000);  // rounds up to the pool's 64 KiB
    ASSERT_TRUE(h.ok());
    EXPECT_TRUE(h->from_pool()) << "request " << i;
    EXPECT_EQ(h->size(), 64u << 10);
    held.push_back(std::move(*h));
  }
  auto other_size = c.MallocPhysical(128 << 10);
  ASSERT_TRUE(other_size.ok());
  EXPECT_FALSE(other_size->from_pool());
  // Pooled memory is fresh: zero, never a previous holder's bytes.
  auto r = c.ReserveMemAddress(64 << 10);
  {
    auto m = c.MapMem(r->base(), 64 << 10, 0, held[0]);
    ASSERT_TRUE(m.ok());
    std::memset(m->data(), 0xff, 64 << 10);
  }
  held.clear();
  for (int i = 0; i < 8; ++i) {
    auto h = c.MallocPhysical(64 << 10);
    ASSERT_TRUE(h.ok());
    auto m = c.MapMem(r->base(), 64 << 10, 0, *h);
    ASSERT_TRUE(m.ok());
    const unsigned char* p = m->as<unsigned char>();
    for (size_t j = 0; j < (64u << 10); j += 512) ASSERT_EQ(p[j], 0) << "stale bytes handed out";
  }
  // Refills happen in the background; wait for the pool to be full again.
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (b.Admin("list pools --json").find("\"ready\": 4") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  pools = b.Admin("list pools --json");
  EXPECT_NE(pools.find("\"ready\": 4"), std::string::npos) << pools;
  EXPECT_NE(pools.find("\"refill_failures\": 0"), std::string::npos) << pools;
  EXPECT_EQ(b.Stat("allocations_live"), 1u);  // other_size
}

// ---- freeing ----------------------------------------------------------------------

TEST(Free, LargeAllocationsGoBackToTheKernelOnAWorkerAndNothingLeaks) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  ASSERT_TRUE(c.Ping().ok());
  const size_t fds_before = b.FdCount();
  constexpr size_t kSize = 64 << 20;  // above --inline-alloc-bytes: returned by a worker
  {
    auto h = c.MallocPhysical(kSize);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
    auto m = MapWhole(c, *h);
    ASSERT_TRUE(m.ok());
    std::memset(m->data(), 0x5a, kSize);  // pages the kernel must free
  }  // unmap, release, free (the broker holds the last reference)
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("allocations_live"), 0u);
  EXPECT_EQ(b.Stat("bytes_allocated"), 0u);  // counted free at once
  EXPECT_EQ(b.WaitForStat("bytes_returning", 0), 0u);
  EXPECT_EQ(b.FdCount(), fds_before);
  EXPECT_TRUE(c.Ping().ok());
  // The four worker threads that create and return memory run at nice 10;
  // the loop thread at 0.
  std::map<pid_t, int> nice = ThreadNiceValues(b.pid());
  EXPECT_EQ(nice.count(b.pid()) ? nice[b.pid()] : -100, 0);
  std::map<int, int> threads_at;
  for (const auto& [tid, n] : nice) ++threads_at[n];
  EXPECT_EQ(threads_at[10], 4) << "not four worker threads at nice 10";
}

// With a delay no test outlives, what waits for a pause is seen waiting: pool
// refills and the return of a freed large allocation's pages, or of a freed
// pool allocation's. A broker that stops returns what waited.
TEST(Free, RefillsAndReturnsWaitForAPauseInTakesAndFrees) {
  BrokerProcess b({"--pool", "64K:normal:2", "--background-delay-ms", "60000"});
  Client c = ConnectOrDie(b);
  ASSERT_TRUE(c.Ping().ok());
  const size_t fds_before = b.FdCount();
  auto t1 = c.MallocPhysical(64 << 10), t2 = c.MallocPhysical(64 << 10), t3 = c.MallocPhysical(64 << 10);
  ASSERT_TRUE(t1.ok() && t2.ok() && t3.ok());
  EXPECT_TRUE(t1->from_pool() && t2->from_pool());
  EXPECT_FALSE(t3->from_pool());  // empty, and not refilled while takes go on
  std::string pools = b.Admin("list pools --json");
  EXPECT_NE(pools.find("\"ready\": 0,"), std::string::npos) << pools;
  EXPECT_NE(pools.find("\"refilling\": 0,"), std::string::npos) << pools;
  EXPECT_NE(pools.find("\"refills\": 0,"), std::string::npos) << pools;
  constexpr size_t kSize = 8 << 20;  // above --inline-alloc-bytes
  {
    auto h = c.MallocPhysical(kSize);
    ASSERT_TRUE(h.ok()) << h.status().ToString();
  }  // freed: counted free at once, its pages wait
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("bytes_allocated"), 3u * (64 << 10));
  EXPECT_EQ(b.Stat("bytes_returning"), kSize);
  EXPECT_EQ(b.FdCount(), fds_before + 2);  // the take that missed, and the freed memfd still open
  // A pool's allocation, small as it is, also goes back after the pause.
  *t1 = PhysicalHandle();
  ASSERT_TRUE(c.Ping().ok());
  EXPECT_EQ(b.Stat("bytes_allocated"), 2u * (64 << 10));
  EXPECT_EQ(b.Stat("bytes_returning"), kSize + (64 << 10));
  EXPECT_EQ(b.FdCount(), fds_before + 2);
  EXPECT_EQ(b.Stop(), 0);
}

// ---- quotas -----------------------------------------------------------------------

TEST(Quotas, PerClientLimitsGiveQuotaExceededAndChangeNothing) {
  BrokerProcess b({"--quota-client", "allocations=2,bytes=1M,imports=1"});
  Client c = ConnectOrDie(b);
  auto a1 = c.MallocPhysical(kPage);
  auto a2 = c.MallocPhysical(kPage);
  ASSERT_TRUE(a1.ok() && a2.ok());
  auto a3 = c.MallocPhysical(kPage);
  EXPECT_EQ(a3.code(), ErrorCode::kQuotaExceeded);
  EXPECT_NE(a3.status().message().find("allocations limit 2: in use 2"), std::string::npos)
      << a3.status().message();
  ASSERT_TRUE(c.FreePhysical(*a1).ok());
  auto big = c.MallocPhysical(2 << 20);
  EXPECT_EQ(big.code(), ErrorCode::kQuotaExceeded);
  EXPECT_NE(big.status().message().find("bytes limit 1048576"), std::string::npos);
  EXPECT_TRUE(c.MallocPhysical(kPage).ok());
  EXPECT_EQ(b.Stat("quota_rejections"), 2u);
  // Imports.
  Client other = ConnectOrDie(b, "importer");
  auto x = other.MallocPhysical(kPage);
  auto y = other.MallocPhysical(kPage);
  auto tx = other.ExportToShareableHandle(*x, kExportNoPidCheck);
  auto ty = other.ExportToShareableHandle(*y, kExportNoPidCheck);
  auto ix = c.ImportFromShareableHandle(*tx);
  EXPECT_TRUE(ix.ok());
  EXPECT_EQ(c.ImportFromShareableHandle(*ty).code(), ErrorCode::kQuotaExceeded);
}

TEST(Quotas, PerUidLimitSpansClientsAndFollowsTheAllocation) {
  BrokerProcess b({"--quota-uid", "default:bytes=1M"});
  Client a = ConnectOrDie(b, "a");
  Client d = ConnectOrDie(b, "d");
  auto first = a.MallocPhysical(768 << 10);
  ASSERT_TRUE(first.ok());
  auto second = d.MallocPhysical(512 << 10);
  EXPECT_EQ(second.code(), ErrorCode::kQuotaExceeded);
  EXPECT_NE(second.status().message().find("uid " + std::to_string(::getuid())), std::string::npos);
  // The creator lets go but an importer keeps it alive: still charged to the uid.
  auto token = a.ExportToShareableHandle(*first, kExportNoPidCheck);
  auto kept = d.ImportFromShareableHandle(*token);
  ASSERT_TRUE(kept.ok());
  *first = PhysicalHandle();
  ASSERT_TRUE(a.Ping().ok());
  EXPECT_EQ(d.MallocPhysical(512 << 10).code(), ErrorCode::kQuotaExceeded);
  *kept = PhysicalHandle();
  ASSERT_TRUE(d.Ping().ok());
  auto last = d.MallocPhysical(512 << 10);
  EXPECT_TRUE(last.ok());
  std::string q = b.Admin("list quotas --json");
  EXPECT_NE(q.find("\"who\": \"uid:" + std::to_string(::getuid()) + "\""), std::string::npos) << q;
}

TEST(Quotas, ConfigFileSetsQuotasAndPoolsAndBadLinesAreNamed) {
  BrokerProcess dir_holder;
  std::string conf = dir_holder.dir() + "/membroker.conf";
  std::ofstream(conf) << "# test config\nmax-pinned-bytes = 2M\nquota-client = allocations=1\npool = 8K:normal:2\n";
  BrokerProcess b({"--config", conf});
  EXPECT_EQ(b.Stat("pinned_budget"), 2u << 20);
  EXPECT_NE(b.Admin("list pools --json").find("\"capacity\": 2"), std::string::npos);
  Client c = ConnectOrDie(b);
  auto h = c.MallocPhysical(8 << 10);
  ASSERT_TRUE(h.ok());
  EXPECT_TRUE(h->from_pool());
  EXPECT_EQ(c.MallocPhysical(kPage).code(), ErrorCode::kQuotaExceeded);

  std::string bad = dir_holder.dir() + "/bad.conf";
  std::ofstream(bad) << "max-bytes = 1G\nquota-client = bytes=lots\n";
  auto r = RunBrokerExpectingExit({"--socket", dir_holder.dir() + "/x.sock", "--config", bad});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.output.find("bad.conf:2"), std::string::npos) << r.output;
}

// ---- mapping options ----------------------------------------------------------------

TEST(Mapping, PopulatePrefaultsAndDefaultAlignmentFitsHugePages) {
  BrokerProcess b;
  Client c = ConnectOrDie(b);
  auto h = c.MallocPhysical(4 << 20);
  ASSERT_TRUE(h.ok());
  auto r = c.ReserveMemAddress(4 << 20);
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(r->base()) % (2 << 20), 0u);
  {
    auto lazy = c.MapMem(r->base(), 4 << 20, 0, *h);
    ASSERT_TRUE(lazy.ok());
    EXPECT_EQ(SmapsOf(lazy->data()).rss, 0u);
  }
  auto eager = c.MapMem(r->base(), 4 << 20, 0, *h, kMapPopulate);
  ASSERT_TRUE(eager.ok());
  EXPECT_EQ(SmapsOf(eager->data()).rss, 4u << 20);
  EXPECT_EQ(c.MapMem(r->base(), 4 << 20, 0, *h, 0x80).code(), ErrorCode::kParamInvalid);
}

}  // namespace
}  // namespace membroker::testing
