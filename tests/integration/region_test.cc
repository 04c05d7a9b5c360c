// In-region structures between real processes: a Boost.Interprocess heap
// opened at another address, its robust lock surviving a holder killed with
// SIGKILL, and the SPSC tensor ring with a consumer killed holding a slot.
#include <csignal>
#include <cstring>
#include <vector>

#include <boost/interprocess/containers/vector.hpp>
#include <gtest/gtest.h>

#include "broker_process.h"
#include "map_whole.h"
#include "membroker/client.h"
#include "membroker/region_heap.h"
#include "membroker/tensor_ring.h"

namespace membroker::testing {
namespace {

constexpr size_t kRegion = 4 << 20;
using IntVector = boost::interprocess::vector<int, RegionHeap::Allocator<int>>;

// A published region, mapped by this process.
struct Region {
  PhysicalHandle handle;
  WholeMapping mem;
};

Region CreateAndPublish(Client& c, const std::string& name) {
  Region r;
  r.handle = *c.MallocPhysical(kRegion);
  r.mem = *MapWhole(c, r.handle);
  EXPECT_TRUE(c.Publish(name, r.handle).ok());
  return r;
}

// Maps a named region; an extra reservation first so it lands at another address.
Result<Region> LookupAndMap(Client& c, const std::string& name, Reservation* elsewhere) {
  *elsewhere = *c.ReserveMemAddress(kRegion);
  Region r;
  MB_ASSIGN_OR_RETURN(r.handle, c.Lookup(name, 5000));
  MB_ASSIGN_OR_RETURN(r.mem, MapWhole(c, r.handle));
  return r;
}

TEST(RegionHeap, ContainersBuiltInOneProcessAreReadInAnotherAtAnotherAddress) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "builder"});
  Region region = CreateAndPublish(c, "heap/table");
  auto heap = RegionHeap::Create(region.mem.data(), kRegion);
  ASSERT_TRUE(heap.ok()) << heap.status().ToString();
  auto made = heap->Construct<IntVector>("numbers", heap->allocator<int>());
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  EXPECT_FALSE(made->previous_holder_died);
  IntVector* v = made->object;
  {
    auto guard = heap->Lock();
    ASSERT_TRUE(guard.ok());
    for (int i = 0; i < 1000; ++i) v->push_back(i);
  }
  EXPECT_EQ(heap->Construct<IntVector>("numbers", heap->allocator<int>()).code(), ErrorCode::kAlreadyExists)
      << "names are unique";
  EXPECT_EQ(heap->Find<IntVector>("absent").code(), ErrorCode::kNotFound);
  uintptr_t here = reinterpret_cast<uintptr_t>(region.mem.data());
  pid_t child = ForkChild([&] {
    auto other = *Client::Connect({broker.socket(), "reader"});
    Reservation elsewhere;
    auto r = LookupAndMap(other, "heap/table", &elsewhere);
    if (!r.ok()) return 10;
    if (reinterpret_cast<uintptr_t>(r->mem.data()) == here) return 11;  // must prove address independence
    auto h = RegionHeap::Open(r->mem.data(), kRegion);
    if (!h.ok()) return 12;
    auto named = h->Find<IntVector>("numbers");
    if (!named.ok() || named->previous_holder_died) return 13;
    IntVector* found = named->object;
    if (found->size() != 1000) return 13;
    long sum = 0;
    for (int x : *found) sum += x;
    if (sum != 999 * 1000 / 2) return 14;
    auto guard = h->Lock();
    found->push_back(-1);  // visible to the creator
    return 0;
  });
  EXPECT_EQ(WaitChild(child), 0);
  EXPECT_EQ(v->size(), 1001u);
  EXPECT_EQ(v->back(), -1);
  EXPECT_EQ(RegionHeap::Open(static_cast<char*>(region.mem.data()) + 4096, kRegion - 4096).code(),
            ErrorCode::kParamInvalid);
}

TEST(RegionHeap, ALockHolderKilledDoesNotWedgeTheHeap) {
  BrokerProcess broker;
  auto c = *Client::Connect({broker.socket(), "owner"});
  Region region = CreateAndPublish(c, "heap/locked");
  auto heap = *RegionHeap::Create(region.mem.data(), kRegion);
  Channel ch;
  pid_t child = ForkChild([&] {
    ch.AsChild();
    auto other = *Client::Connect({broker.socket(), "holder"});
    Reservation elsewhere;
    auto r = LookupAndMap(other, "heap/locked", &elsewhere);
    if (!r.ok()) return 10;
    auto h = RegionHeap::Open(r->mem.data(), kRegion);
    auto guard = h->Lock();
    ch.Send("locked");
    ch.Receive();  // killed while holding the lock
    return 11;
  });
  ch.AsParent();
  ASSERT_EQ(ch.Receive(), "locked");
  ::kill(child, SIGKILL);
  EXPECT_EQ(WaitChild(child), 128 + SIGKILL);
  // The next lock taker hears of it, through Find as through Lock.
  auto found = heap.Find<IntVector>("absent");
  EXPECT_EQ(found.code(), ErrorCode::kNotFound);
  ASSERT_TRUE(heap.Construct<IntVector>("after", heap.allocator<int>()).ok());
  pid_t second = ForkChild([&] {
    auto other = *Client::Connect({broker.socket(), "holder2"});
    Reservation elsewhere;
    auto r = LookupAndMap(other, "heap/locked", &elsewhere);
    if (!r.ok()) return 10;
    auto h = RegionHeap::Open(r->mem.data(), kRegion);
    auto g = h->Lock();
    if (!g.ok()) return 12;
    ::raise(SIGKILL);  // dies holding it again
    return 11;
  });
  EXPECT_EQ(WaitChild(second), 128 + SIGKILL);
  auto named = heap.Find<IntVector>("after");
  ASSERT_TRUE(named.ok()) << named.status().ToString();
  EXPECT_TRUE(named->previous_holder_died);
  auto guard = heap.Lock();
  ASSERT_TRUE(guard.ok());
  EXPECT_FALSE(guard.previous_holder_died());
}

// What another process wrote into a ring's header is not trusted: a header
// whose geometry does not fit the region, impossible positions, or a slot
// that claims more bytes than it holds are PROTOCOL_ERROR, never a read
// outside the region. (The offsets are the header's layout in tensor_ring.cc:
// magic 0, slots 8, slot_bytes 16, data_offset 24, published 64, released 128.)
TEST(TensorRing, AttachValidatesWhatAnotherProcessWrote) {
  constexpr uint32_t kSlots = 4;
  constexpr size_t kSlotBytes = 4096;
  const size_t bytes = TensorRing::BytesFor(kSlots, kSlotBytes);
  std::vector<uint64_t> storage(bytes / 8 + 1);
  char* base = reinterpret_cast<char*>(storage.data());
  auto fresh = [&] { return TensorRing::Create(base, bytes, kSlots, kSlotBytes); };
  auto put32 = [&](size_t at, uint32_t v) { std::memcpy(base + at, &v, sizeof(v)); };
  auto put64 = [&](size_t at, uint64_t v) { std::memcpy(base + at, &v, sizeof(v)); };
  ASSERT_TRUE(fresh().ok());
  ASSERT_TRUE(TensorRing::Attach(base, bytes).ok());
  EXPECT_EQ(TensorRing::Attach(base, bytes - 1).code(), ErrorCode::kProtocolError);  // too small
  put32(8, 0);  // no slots: % 0 would crash
  EXPECT_EQ(TensorRing::Attach(base, bytes).code(), ErrorCode::kProtocolError);
  ASSERT_TRUE(fresh().ok());
  put32(8, 0xffffffffu);  // more slots than the region holds
  EXPECT_EQ(TensorRing::Attach(base, bytes).code(), ErrorCode::kProtocolError);
  ASSERT_TRUE(fresh().ok());
  put64(16, uint64_t{1} << 62);  // slot size that overflows
  EXPECT_EQ(TensorRing::Attach(base, bytes).code(), ErrorCode::kProtocolError);
  ASSERT_TRUE(fresh().ok());
  put64(24, bytes);  // slots start past the end
  EXPECT_EQ(TensorRing::Attach(base, bytes).code(), ErrorCode::kProtocolError);
  ASSERT_TRUE(fresh().ok());
  put64(64, 100);  // published far ahead of released
  EXPECT_EQ(TensorRing::Attach(base, bytes).code(), ErrorCode::kProtocolError);

  // After a good attach, a scribbled position or slot size is caught on use.
  auto ring = fresh();
  ASSERT_TRUE(ring.ok());
  auto w = ring->AcquireForWrite(0);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE(ring->Publish(*w, 1, 10).ok());
  put64(64 + 64, 5);  // released beyond published
  EXPECT_EQ(ring->AcquireForRead(0).code(), ErrorCode::kProtocolError);
  EXPECT_EQ(ring->AcquireForWrite(0).code(), ErrorCode::kProtocolError);
  put64(64 + 64, 0);
  put32(8, 1 << 20);  // the header's slot count changes: the ring keeps its own
  auto r = ring->AcquireForRead(0);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->bytes, 10u);
  EXPECT_EQ(ring->slots(), kSlots);
}

TEST(TensorRing, FramesCrossProcessesInOrderAndAKilledConsumerLosesNone) {
  BrokerProcess broker;
  constexpr uint64_t kFrames = 500;
  constexpr size_t kSlotBytes = 64 << 10;
  // Consumers: the first is killed holding a slot; the second finishes.
  Channel first, second;
  auto consumer = [&](Channel& ch, bool die_holding) {
    return ForkChild([&ch, &broker, die_holding] {
      ch.AsChild();
      if (ch.Receive() != "go") return 9;
      auto c = *Client::Connect({broker.socket(), "consumer"});
      Reservation elsewhere;
      auto r = LookupAndMap(c, "ring/0", &elsewhere);
      if (!r.ok()) return 10;
      auto ring = TensorRing::Attach(r->mem.data(), kRegion);
      if (!ring.ok()) return 11;
      uint64_t expected = 0;
      for (;;) {
        auto slot = ring->AcquireForRead(10000);
        if (!slot.ok()) return 12;
        if (expected == 0) {
          ch.Send("first " + std::to_string(slot->frame_id));
          expected = slot->frame_id;
        }
        if (slot->frame_id != expected) return 13;
        const auto* p = static_cast<const unsigned char*>(slot->data);
        for (size_t i = 0; i < slot->bytes; ++i)
          if (p[i] != static_cast<unsigned char>(slot->frame_id + i)) return 14;
        if (die_holding && slot->frame_id == 100) {
          ch.Send("holding 100");
          ch.Receive();  // killed here, slot not released
        }
        if (!ring->Release(*slot).ok()) return 15;
        if (slot->frame_id == kFrames) return 0;
        ++expected;
      }
    });
  };
  pid_t c1 = consumer(first, true);
  pid_t c2 = consumer(second, false);
  first.AsParent();
  second.AsParent();

  auto c = *Client::Connect({broker.socket(), "producer"});
  Region region = CreateAndPublish(c, "ring/0");
  auto ring = TensorRing::Create(region.mem.data(), kRegion, 8, kSlotBytes);
  ASSERT_TRUE(ring.ok()) << ring.status().ToString();
  EXPECT_EQ(TensorRing::Create(region.mem.data(), kRegion, 1000, kSlotBytes).code(), ErrorCode::kParamInvalid);
  first.Send("go");
  uint64_t frame = 1;
  auto produce_until = [&](uint64_t last) {
    for (; frame <= last; ++frame) {
      auto slot = ring->AcquireForWrite(10000);
      ASSERT_TRUE(slot.ok()) << slot.status().ToString();
      auto* p = static_cast<unsigned char*>(slot->data);
      size_t bytes = kSlotBytes - frame % 100;
      for (size_t i = 0; i < bytes; ++i) p[i] = static_cast<unsigned char>(frame + i);
      ASSERT_TRUE(ring->Publish(*slot, frame, bytes).ok());
    }
  };
  produce_until(100);
  ASSERT_EQ(first.Receive(), "first 1");
  ASSERT_EQ(first.Receive(), "holding 100");
  ::kill(c1, SIGKILL);
  EXPECT_EQ(WaitChild(c1), 128 + SIGKILL);
  EXPECT_EQ(ring->released(), 99u) << "frame 100 is still held";
  EXPECT_EQ(ring->AcquireForWrite(0).ok(), true) << "the ring is not full";
  second.Send("go");
  EXPECT_EQ(second.Receive(), "first 100") << "the replacement gets the slot the dead consumer held";
  produce_until(kFrames);
  EXPECT_EQ(WaitChild(c2), 0);
  EXPECT_EQ(ring->released(), kFrames);
  EXPECT_EQ(ring->last_published_frame(), kFrames);
  EXPECT_EQ(ring->AcquireForRead(0).code(), ErrorCode::kTimeout);
}

}  // namespace
}  // namespace membroker::testing
