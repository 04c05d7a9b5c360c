// BlockStore and its eviction policies without a broker process: the rules of
// kv/block_store.h and kv/eviction.h, and the KV messages' limits on the wire.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kv/block_store.h"
#include "kv/disk_tier.h"
#include "kv/eviction.h"
#include "membroker/ipc/protocol.h"

namespace membroker::broker {
namespace {

constexpr uint64_t kBlock = 4096;

// A writer's memory: a memfd of n blocks, block i filled with byte 'a' + i.
struct Source {
  explicit Source(int n) : fd(::memfd_create("source", MFD_CLOEXEC)) {
    EXPECT_EQ(::ftruncate(fd, static_cast<off_t>(n * kBlock)), 0);
    for (int i = 0; i < n; ++i) {
      std::string bytes(kBlock, static_cast<char>('a' + i));
      EXPECT_EQ(::pwrite(fd, bytes.data(), kBlock, static_cast<off_t>(i * kBlock)), static_cast<ssize_t>(kBlock));
    }
  }
  ~Source() { ::close(fd); }
  int fd;
};

std::unique_ptr<BlockStore> Store(uint64_t blocks, EvictionKind eviction = EvictionKind::kS3Fifo) {
  auto s = BlockStore::Create(1, {"test", kBlock, blocks, ipc::PagePolicy::kNormalOnly, eviction, 0});
  EXPECT_TRUE(s.ok()) << s.status().ToString();
  return s.ok() ? std::move(*s) : nullptr;
}

ipc::KvBlock PutOne(BlockStore& s, uint64_t session, const std::string& key, const Source& src, int block) {
  ipc::KvBlock r = s.Reserve(session, key);
  if (r.code != ErrorCode::kOk) return r;
  return s.Seal(session, {r.slot, r.generation, 1, block * kBlock, kBlock}, src.fd);
}

// What a reader of the slab (read-only, as a client maps it) finds at a block.
char FirstByte(const BlockStore& s, const ipc::KvBlock& b) {
  const auto d = s.Describe();
  auto fd = s.SlabFd(static_cast<uint32_t>(b.slot / d.slab_blocks));
  EXPECT_TRUE(fd.ok());
  const size_t size = d.slab_blocks * kBlock;
  void* p = ::mmap(nullptr, size, PROT_READ, MAP_SHARED, *fd, 0);
  EXPECT_NE(p, MAP_FAILED);
  char c = static_cast<const char*>(p)[(b.slot % d.slab_blocks) * kBlock];
  ::munmap(p, size);
  return c;
}

TEST(BlockStore, PutInTwoPhasesAndGetUnderALease) {
  auto s = Store(8);
  Source src(4);
  ipc::KvBlock r = s->Reserve(7, "k");
  ASSERT_EQ(r.code, ErrorCode::kOk);
  EXPECT_EQ(s->Get(8, "k", false).code, ErrorCode::kNotFound);  // invisible until sealed
  EXPECT_EQ(s->Reserve(8, "k").code, ErrorCode::kBusy);
  EXPECT_EQ(s->Seal(8, {r.slot, r.generation, 1, 0, kBlock}, src.fd).code, ErrorCode::kInvalidHandle);
  EXPECT_EQ(s->Seal(7, {r.slot, r.generation, 1, 0, kBlock + 1}, src.fd).code, ErrorCode::kParamInvalid);
  EXPECT_EQ(s->Seal(7, {r.slot, r.generation, 1, 4 * kBlock, kBlock}, src.fd).code, ErrorCode::kOutOfRange);
  EXPECT_EQ(s->Seal(7, {r.slot, r.generation + 1, 1, 0, kBlock}, src.fd).code, ErrorCode::kStale);
  ASSERT_EQ(s->Seal(7, {r.slot, r.generation, 1, 2 * kBlock, 100}, src.fd).code, ErrorCode::kOk);
  ipc::KvBlock g = s->Get(8, "k", true);
  ASSERT_EQ(g.code, ErrorCode::kOk);
  EXPECT_EQ(g.length, 100u);
  EXPECT_EQ(FirstByte(*s, g), 'c');
  EXPECT_EQ(s->Reserve(9, "k").code, ErrorCode::kAlreadyExists);
  EXPECT_EQ(s->leases_held(), 1u);
  EXPECT_TRUE(s->InUse());
  EXPECT_EQ(s->Release(9, {g.slot, g.generation}), ErrorCode::kInvalidHandle);  // not 9's lease
  EXPECT_EQ(s->Release(8, {g.slot, g.generation}), ErrorCode::kOk);
  EXPECT_EQ(s->Release(8, {g.slot, g.generation}), ErrorCode::kInvalidHandle);
  EXPECT_FALSE(s->InUse());
  EXPECT_TRUE(s->Check().ok()) << s->Check().ToString();
}

TEST(BlockStore, LeasesOnABlockAreCountedUpToACap) {
  auto s = Store(4);
  Source src(1);
  ASSERT_EQ(PutOne(*s, 1, "k", src, 0).code, ErrorCode::kOk);
  for (uint32_t i = 0; i < kKvMaxLeasesPerBlock; ++i) ASSERT_EQ(s->Get(2, "k", true).code, ErrorCode::kOk);
  EXPECT_EQ(s->Get(2, "k", true).code, ErrorCode::kResourceExhausted);
  EXPECT_EQ(s->Get(3, "k", true).code, ErrorCode::kOk);  // another client's count is its own
  EXPECT_EQ(s->leases_held(), kKvMaxLeasesPerBlock + 1u);
  s->OnSessionEnd(2);
  EXPECT_EQ(s->leases_held(), 1u);
  EXPECT_TRUE(s->Check().ok()) << s->Check().ToString();
}

TEST(BlockStore, ASessionsEndTakesItsLeasesAndReservations) {
  auto s = Store(8);
  Source src(4);
  ASSERT_EQ(PutOne(*s, 1, "sealed", src, 0).code, ErrorCode::kOk);
  ASSERT_EQ(s->Get(2, "sealed", true).code, ErrorCode::kOk);
  ASSERT_EQ(s->Get(2, "sealed", true).code, ErrorCode::kOk);
  ASSERT_EQ(s->Reserve(2, "half").code, ErrorCode::kOk);
  EXPECT_EQ(s->BySession().at(2), std::make_pair(uint64_t{2}, uint64_t{1}));
  s->OnSessionEnd(2);
  EXPECT_FALSE(s->InUse());
  EXPECT_EQ(s->used_blocks(), 1u);
  EXPECT_EQ(s->Reserve(3, "half").code, ErrorCode::kOk);  // free to write again
  EXPECT_TRUE(s->Check().ok()) << s->Check().ToString();
}

// A reference names a slot and its generation: once the block is evicted and
// the slot given to another key, the old reference is STALE.
TEST(BlockStore, AReusedSlotMakesOldReferencesStale) {
  auto s = Store(4);
  Source src(4);
  ipc::KvBlock first = PutOne(*s, 1, "k0", src, 0);
  ASSERT_EQ(first.code, ErrorCode::kOk);
  for (int i = 1; i < 40; ++i) ASSERT_EQ(PutOne(*s, 1, "k" + std::to_string(i), src, i % 4).code, ErrorCode::kOk);
  EXPECT_EQ(s->Get(1, "k0", false).code, ErrorCode::kNotFound);
  EXPECT_EQ(s->Release(1, {first.slot, first.generation}), ErrorCode::kStale);
  EXPECT_EQ(s->Abort(1, {first.slot, first.generation}), ErrorCode::kStale);
  EXPECT_EQ(s->Release(1, {999, 1}), ErrorCode::kStale);  // no such slot: never valid
  EXPECT_EQ(s->Release(1, {first.slot, 0}), ErrorCode::kStale);
  EXPECT_GE(s->stats().evictions, 36u);
  EXPECT_TRUE(s->Check().ok()) << s->Check().ToString();
}

// Slots freed together are taken lowest first: a batch put after an eviction
// lies in ascending order (the order a reader goes through it fastest), where
// taking them as evictions pushed them gave it in descending order.
TEST(BlockStore, ABatchAfterAnEvictionTakesItsSlotsInAscendingOrder) {
  auto s = Store(20);
  Source src(4);
  for (int i = 0; i < 19; ++i) ASSERT_EQ(PutOne(*s, 1, "k" + std::to_string(i), src, i % 4).code, ErrorCode::kOk);
  s->MakeRoom(8);  // evicts the 7 oldest, slots 0 to 6 (slot 19 was free)
  std::vector<uint64_t> slots;
  for (int i = 0; i < 6; ++i) {
    ipc::KvBlock b = s->Reserve(1, "new" + std::to_string(i));
    ASSERT_EQ(b.code, ErrorCode::kOk);
    slots.push_back(b.slot);
  }
  EXPECT_EQ(slots, (std::vector<uint64_t>{0, 1, 2, 3, 4, 5}));
  EXPECT_TRUE(s->Check().ok()) << s->Check().ToString();
}

TEST(BlockStore, TheSpecIsChecked) {
  auto make = [](uint64_t block, uint64_t blocks) {
    return BlockStore::Create(1, {"s", block, blocks, ipc::PagePolicy::kNormalOnly, EvictionKind::kS3Fifo, 0})
        .status()
        .code();
  };
  EXPECT_EQ(make(100, 4), ErrorCode::kParamInvalid);
  EXPECT_EQ(make(0, 4), ErrorCode::kParamInvalid);
  EXPECT_EQ(make(kBlock, 0), ErrorCode::kParamInvalid);
  EXPECT_EQ(make(512ull << 20, 1), ErrorCode::kParamInvalid);
  EXPECT_EQ(make(64, (64ull << 20) / 64 * kKvMaxSlabs + 1), ErrorCode::kParamInvalid);
  // Slabs: 64 MiB of blocks each, the last one shorter.
  auto s = BlockStore::Create(1, {"s", 1 << 20, 100, ipc::PagePolicy::kNormalOnly, EvictionKind::kLru, 0});
  ASSERT_TRUE(s.ok());
  EXPECT_EQ((*s)->Describe().slab_blocks, 64u);
  EXPECT_EQ((*s)->slab_count(), 2u);
  EXPECT_EQ((*s)->bytes(), 100ull << 20);
  EXPECT_EQ((*s)->SlabFd(2).status().code(), ErrorCode::kParamInvalid);
}

// The policies on a trace with scans: a working set read again and again,
// interrupted by long scans of blocks read once. S3-FIFO keeps the working
// set through the scans; LRU lets every scan flush it.
// A seal's copy on a worker thread (BeginCopy, CopyInto, EndCopy): a slot
// whose writer aborts or ends while a worker copies into it is not given to
// another key until the copy ends, and then it is not sealed.
TEST(BlockStore, ASlotBeingCopiedIntoIsNotReusedUntilTheCopyEnds) {
  auto s = Store(2);
  Source src(2);
  ipc::KvBlock r = s->Reserve(1, "k");
  ASSERT_EQ(r.code, ErrorCode::kOk);
  const ipc::KvSeal seal{r.slot, r.generation, 1, 0, kBlock};
  std::byte* to = nullptr;
  ASSERT_EQ(s->BeginCopy(1, seal, &to).code, ErrorCode::kOk);
  EXPECT_EQ(s->BeginCopy(1, seal, &to).code, ErrorCode::kInvalidHandle);  // one copy at a time
  EXPECT_TRUE(s->InUse());
  s->OnSessionEnd(1);  // the writer ends mid-copy
  EXPECT_TRUE(s->InUse());
  ipc::KvBlock other = s->Reserve(2, "other");
  ASSERT_EQ(other.code, ErrorCode::kOk);
  EXPECT_NE(other.slot, r.slot);  // the slot being written by the copy is not handed out
  EXPECT_EQ(s->Reserve(3, "third").code, ErrorCode::kResourceExhausted);
  EXPECT_TRUE(s->Check().ok()) << s->Check().ToString();
  ASSERT_EQ(BlockStore::CopyInto(to, src.fd, 0, kBlock), ErrorCode::kOk);
  EXPECT_EQ(s->EndCopy(1, seal, ErrorCode::kOk).code, ErrorCode::kInvalidHandle);  // not sealed
  EXPECT_EQ(s->Get(2, "k", false).code, ErrorCode::kNotFound);
  EXPECT_EQ(s->Reserve(3, "third").code, ErrorCode::kOk);  // free again
  EXPECT_TRUE(s->Check().ok()) << s->Check().ToString();
}

// A store made again from its index and slabs (what a take-over or the fd
// store passes): the sealed blocks come back in new memory, slot for slot,
// with their keys and generations; writes in progress do not; a damaged
// record and a slab that did not come lose only their blocks.
std::vector<ipc::UniqueFd> SlabFds(const BlockStore& s) {
  std::vector<ipc::UniqueFd> out;
  for (uint32_t i = 0; i < s.slab_count(); ++i) out.emplace_back(::fcntl(*s.SlabFd(i), F_DUPFD_CLOEXEC, 0));
  return out;
}

TEST(BlockStore, ARestoredStoreHasTheSealedBlocksInNewMemory) {
  auto s = Store(8);
  Source src(4);
  std::vector<ipc::KvBlock> sealed;
  for (int i = 0; i < 3; ++i) sealed.push_back(PutOne(*s, 1, "k" + std::to_string(i), src, i));
  const ipc::KvBlock writing = s->Reserve(2, "half");
  ASSERT_EQ(writing.code, ErrorCode::kOk);
  auto index = KvIndex::Read(s->index_fd());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  EXPECT_EQ(index->store, s->id());
  EXPECT_EQ(index->spec.name, "test");
  auto r = BlockStore::Restore(*index, SlabFds(*s), index->generation + 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  BlockStore& again = *r->store;
  EXPECT_EQ(r->blocks, 3u);
  EXPECT_EQ(r->dropped, 0u);
  EXPECT_EQ(again.generation(), 1u);
  for (int i = 0; i < 3; ++i) {
    ipc::KvBlock g = again.Get(5, "k" + std::to_string(i), false);
    ASSERT_EQ(g.code, ErrorCode::kOk);
    EXPECT_EQ(g.slot, sealed[i].slot);
    EXPECT_EQ(g.generation, sealed[i].generation);
    EXPECT_EQ(FirstByte(again, g), 'a' + i);
  }
  // The reservation did not survive; its slot is free, above the writer's generation.
  EXPECT_EQ(again.Get(5, "half", false).code, ErrorCode::kNotFound);
  EXPECT_EQ(again.Seal(2, {writing.slot, writing.generation, 1, 0, kBlock}, src.fd).code, ErrorCode::kInvalidHandle);
  ipc::KvBlock next = again.Reserve(3, "next");
  ASSERT_EQ(next.code, ErrorCode::kOk);
  if (next.slot == writing.slot) {
    EXPECT_GT(next.generation, writing.generation);
  }
  EXPECT_TRUE(again.Check().ok()) << again.Check().ToString();
  // New memory: the old slab's fd is not the new one's file.
  struct stat a {
  }, b{};
  ASSERT_EQ(::fstat(*s->SlabFd(0), &a), 0);
  ASSERT_EQ(::fstat(*again.SlabFd(0), &b), 0);
  EXPECT_NE(a.st_ino, b.st_ino);
}

TEST(BlockStore, ADamagedRecordOrAMissingSlabLosesOnlyItsBlocks) {
  // 64 KiB blocks: 1024 a slab, so 1100 blocks make two slabs.
  auto made = BlockStore::Create(9, {"two-slabs", 64 << 10, 1100, ipc::PagePolicy::kNormalOnly, EvictionKind::kLru, 0});
  ASSERT_TRUE(made.ok()) << made.status().ToString();
  BlockStore& s = **made;
  ASSERT_EQ(s.slab_count(), 2u);
  ipc::UniqueFd src(::memfd_create("src", MFD_CLOEXEC));
  ASSERT_EQ(::ftruncate(src.get(), 64 << 10), 0);
  for (int i = 0; i < 1030; ++i) {
    ipc::KvBlock r = s.Reserve(1, "k" + std::to_string(i));
    ASSERT_EQ(r.code, ErrorCode::kOk);
    ASSERT_EQ(s.Seal(1, {r.slot, r.generation, 1, 0, 100}, src.get()).code, ErrorCode::kOk);
  }
  // A torn record: one byte of slot 5's key changed in the index.
  const uint64_t slot5 = s.Get(1, "k5", false).slot;
  ASSERT_EQ(::pwrite(s.index_fd(), "X", 1, static_cast<off_t>(256 + slot5 * 96 + 24)), 1);
  auto index = KvIndex::Read(s.index_fd());
  ASSERT_TRUE(index.ok()) << index.status().ToString();
  ASSERT_EQ(index->damaged.size(), 1u);
  std::vector<ipc::UniqueFd> slabs = SlabFds(s);
  slabs[1].reset();  // the second slab did not come
  auto r = BlockStore::Restore(*index, std::move(slabs), 1);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->blocks, 1030u - 1 - 6);  // slot 5's block, and the 6 blocks of the second slab
  EXPECT_EQ(r->dropped, 1u + 6);
  EXPECT_EQ(r->store->Get(1, "k5", false).code, ErrorCode::kNotFound);
  EXPECT_EQ(r->store->Get(1, "k4", false).code, ErrorCode::kOk);
  EXPECT_EQ(r->store->Get(1, "k1029", false).code, ErrorCode::kNotFound);
  // The damaged slot's generation is above every other: no old reference to it is valid.
  EXPECT_EQ(r->store->Release(1, {slot5, 1}), ErrorCode::kStale);
  // ...and the new index says so, for the restart after this one.
  auto next = KvIndex::Read(r->store->index_fd());
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(next->damaged.empty());
  bool recorded = false;
  for (const auto& rec : next->records)
    if (rec.slot == slot5) recorded = !rec.sealed && rec.generation == index->max_generation + 1;
  EXPECT_TRUE(recorded);
  EXPECT_TRUE(r->store->Check().ok()) << r->store->Check().ToString();
  // An index whose header is damaged is refused whole.
  ASSERT_EQ(::pwrite(s.index_fd(), "Y", 1, 40), 1);
  EXPECT_EQ(KvIndex::Read(s.index_fd()).status().code(), ErrorCode::kProtocolError);
}

double HitRate(EvictionKind kind) {
  constexpr uint64_t kCapacity = 100;
  auto policy = EvictionPolicy::Make(kind, kCapacity);
  std::unordered_map<uint64_t, uint64_t> slot_of;  // key -> slot
  std::vector<uint64_t> key_of(kCapacity, UINT64_MAX);
  std::vector<uint64_t> free;
  for (uint64_t i = 0; i < kCapacity; ++i) free.push_back(i);
  uint64_t hits = 0, gets = 0, scan_key = 1'000'000;
  auto access = [&](uint64_t key) {
    ++gets;
    if (auto it = slot_of.find(key); it != slot_of.end()) {
      ++hits;
      policy->Accessed(it->second);
      return;
    }
    if (free.empty()) {
      auto v = policy->Victim([](uint64_t) { return true; });
      EXPECT_TRUE(v.has_value());
      slot_of.erase(key_of[*v]);
      free.push_back(*v);
    }
    const uint64_t slot = free.back();
    free.pop_back();
    slot_of[key] = slot;
    key_of[slot] = key;
    policy->Inserted(slot, std::hash<uint64_t>{}(key));
  };
  for (int round = 0; round < 50; ++round) {
    for (int rep = 0; rep < 3; ++rep)
      for (uint64_t k = 0; k < 60; ++k) access(k);     // the working set: 60% of the capacity
    for (int i = 0; i < 150; ++i) access(scan_key++);  // a scan, 1.5x the capacity
  }
  return static_cast<double>(hits) / static_cast<double>(gets);
}

// Every working-set read after its first is a hit at best: 180 of each
// round's 330 reads, 0.545. (A deterministic trace: the rates are exact.)
TEST(Eviction, S3FifoKeepsTheWorkingSetThroughScans) {
  const double s3 = HitRate(EvictionKind::kS3Fifo), lru = HitRate(EvictionKind::kLru);
  EXPECT_GT(s3, 0.53) << "s3fifo " << s3 << " lru " << lru;
  EXPECT_LT(lru, 0.40) << "s3fifo " << s3 << " lru " << lru;
}

TEST(Eviction, VictimsAreOnlyWhatMayBeEvicted) {
  for (EvictionKind kind : {EvictionKind::kS3Fifo, EvictionKind::kLru}) {
    auto p = EvictionPolicy::Make(kind, 10);
    for (uint64_t i = 0; i < 10; ++i) p->Inserted(i, i);
    p->Accessed(3);
    EXPECT_FALSE(p->Victim([](uint64_t) { return false; }).has_value());
    auto v = p->Victim([](uint64_t slot) { return slot == 7; });
    ASSERT_TRUE(v.has_value());
    EXPECT_EQ(*v, 7u);
    p->Removed(2);
    EXPECT_EQ(p->size(), 8u);
    for (int i = 0; i < 8; ++i) {
      auto x = p->Victim([](uint64_t) { return true; });
      ASSERT_TRUE(x.has_value());
      EXPECT_NE(*x, 2u);
      EXPECT_NE(*x, 7u);
    }
    EXPECT_EQ(p->size(), 0u);
    EXPECT_FALSE(p->Victim([](uint64_t) { return true; }).has_value());
  }
}

// Every block of S3-FIFO's small FIFO is leased (new blocks a reader holds)
// and small is above its target: main's blocks are still found (the small
// FIFO was once searched alone until the budget ran out, and the store
// refused reservations with evictable blocks in main).
TEST(Eviction, LeasedNewBlocksDoNotHideMainsBlocks) {
  auto p = EvictionPolicy::Make(EvictionKind::kS3Fifo, 20);
  for (uint64_t i = 0; i < 10; ++i) p->Inserted(i, i);
  for (uint64_t i = 0; i < 10; ++i) p->Accessed(i);
  // Round small once: each was read, so each moves to main.
  for (uint64_t i = 0; i < 10; ++i) (void)p->Victim([](uint64_t) { return false; });
  for (uint64_t i = 10; i < 16; ++i) p->Inserted(i, i);  // small: 6, above its target of 2
  auto v = p->Victim([](uint64_t slot) { return slot < 10; });  // everything new is leased
  ASSERT_TRUE(v.has_value());
  EXPECT_LT(*v, 10u);
}

// Keys evicted and sealed again while their ghosts are remembered, over and
// over, past the ghost FIFO's length: the ghosts age out one by one (a ghost
// forgotten at re-insertion once left the FIFO's count behind; the broker
// crashed trimming it, found by examples/kv_cache).
TEST(Eviction, GhostsAgeOutThroughReinsertions) {
  auto p = EvictionPolicy::Make(EvictionKind::kS3Fifo, 10);
  std::vector<uint64_t> key_of(10);
  for (uint64_t i = 0; i < 10; ++i) {
    key_of[i] = i;
    p->Inserted(i, i);
  }
  uint64_t next_key = 10;
  for (int round = 0; round < 2000; ++round) {
    auto v = p->Victim([](uint64_t) { return true; });
    ASSERT_TRUE(v.has_value());
    // Half the time the evicted key comes straight back (its ghost is there),
    // else a key from a few evictions ago, else a new one.
    const uint64_t key = round % 2 == 0 ? key_of[*v] : round % 3 == 0 ? next_key - 3 : next_key++;
    key_of[*v] = key;
    p->Inserted(*v, key);
    p->Accessed((*v + 1) % 10);
  }
  EXPECT_EQ(p->size(), 10u);
}

// The disk tier's directory for one test, removed after it.
struct TierDir {
  std::string path;
  TierDir() {
    char tmpl[] = "/tmp/membroker-tier.XXXXXX";
    path = ::mkdtemp(tmpl);
  }
  ~TierDir() { (void)!std::system(("rm -rf '" + path + "'").c_str()); }
};

// Writes block i of src for key into the tier, as a spill does.
Status Spill(KvDiskTier& tier, const Source& src, int i, const std::string& key) {
  auto w = tier.BeginWrite("test", key, kBlock, kBlock);
  if (!w) return Status(ErrorCode::kAlreadyExists, "not begun");
  w->slab = std::make_shared<const ipc::UniqueFd>(::fcntl(src.fd, F_DUPFD_CLOEXEC, 0));
  w->offset = static_cast<uint64_t>(i) * kBlock;
  Status st = KvDiskTier::Copy(*w);
  if (st.ok()) st = KvDiskTier::Perform(*w);
  tier.EndWrite(*w, st);
  return st;
}

TEST(KvDiskTier, ABlockWrittenOutReadsBackAndAnotherTierFindsIt) {
  TierDir dir;
  Source src(3);
  auto tier = *KvDiskTier::Open(dir.path, 1 << 20);
  ASSERT_TRUE(Spill(*tier, src, 1, "k1").ok());
  EXPECT_TRUE(tier->Has("test", "k1"));
  EXPECT_FALSE(tier->Has("other", "k1"));
  EXPECT_FALSE(tier->BeginWrite("test", "k1", kBlock, kBlock).has_value());  // one file per key
  auto r = tier->BeginRead("test", "k1", kBlock);
  ASSERT_TRUE(r.has_value());
  std::vector<std::byte> got(kBlock);
  auto n = KvDiskTier::Perform(*r, got.data());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, kBlock);
  EXPECT_EQ(std::to_integer<char>(got[0]), 'b');
  tier->EndRead(*r, n);
  EXPECT_EQ(tier->stats().promoted, 1u);

  tier.reset();  // (its lock goes with it)
  auto again = *KvDiskTier::Open(dir.path, 1 << 20);
  EXPECT_EQ(again->stats().found, 1u);
  EXPECT_TRUE(again->Has("test", "k1"));
  // A store of that name with other blocks: the file is not its block.
  EXPECT_FALSE(again->BeginRead("test", "k1", 2 * kBlock).has_value());
  EXPECT_EQ(again->stats().damaged, 1u);
  EXPECT_FALSE(again->Has("test", "k1"));
}

// Block files are written as version 2 (a four-lane payload checksum) and
// version 1 files are still read, and still checked: the fuzz corpus's
// "whole" and "whole_v2" are one of each (store model/kv, key key-0, 1 KiB of
// a 4 KiB block), and pin the format.
TEST(KvDiskTier, BothFileVersionsAreReadAndChecked) {
  TierDir dir;
  const std::string path = dir.path + "/block.kv";
  auto read = [&](const std::vector<char>& bytes) {
    std::ofstream(path, std::ios::binary | std::ios::trunc)
        .write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    std::vector<std::byte> to(4096);
    KvDiskTier::Read r;
    r.store = "model/kv";
    r.key = "key-0";
    r.block_size = 4096;
    r.sequence = 1;
    r.path = path;
    return KvDiskTier::Perform(r, to.data());
  };
  for (const auto& [name, magic] : {std::pair{"whole", "MBKVDSK1"}, std::pair{"whole_v2", "MBKVDSK2"}}) {
    std::ifstream in(std::string(MEMBROKER_SOURCE_DIR) + "/tests/fuzz/corpus/kv_disk_file/" + name, std::ios::binary);
    std::vector<char> file((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    ASSERT_EQ(file.size(), 248u + 1024u) << name;
    ASSERT_EQ(std::string(file.data(), 8), magic);
    auto got = read(file);
    ASSERT_TRUE(got.ok()) << name << ": " << got.status().ToString();
    EXPECT_EQ(*got, 1024u);
    for (size_t at : {size_t{248}, size_t{248 + 600}, file.size() - 1}) {  // payload bytes: lanes and tail
      std::vector<char> damaged = file;
      damaged[at] ^= 0x5a;
      got = read(damaged);
      ASSERT_FALSE(got.ok()) << name << " with byte " << at << " changed";
      EXPECT_NE(got.status().message().find("payload fails its checksum"), std::string::npos)
          << got.status().message();
    }
  }
}

TEST(KvDiskTier, TheOldestGoButNotOneBeingRead) {
  TierDir dir;
  Source src(4);
  auto tier = *KvDiskTier::Open(dir.path, 2 * kBlock);
  ASSERT_TRUE(Spill(*tier, src, 0, "k0").ok());
  ASSERT_TRUE(Spill(*tier, src, 1, "k1").ok());
  auto reading = tier->BeginRead("test", "k0", kBlock);  // the oldest, being read
  ASSERT_TRUE(reading.has_value());
  ASSERT_TRUE(Spill(*tier, src, 2, "k2").ok());
  EXPECT_TRUE(tier->Has("test", "k0"));
  EXPECT_FALSE(tier->Has("test", "k1"));
  EXPECT_EQ(tier->stats().trimmed, 1u);
  EXPECT_EQ(tier->stats().bytes, 2 * kBlock);
  tier->CancelRead(*reading);
  ASSERT_TRUE(Spill(*tier, src, 3, "k3").ok());
  EXPECT_FALSE(tier->Has("test", "k0"));
  EXPECT_EQ(tier->StoreUsage("test"), std::make_pair(uint64_t{2}, 2 * kBlock));
}

// A key evicted a moment ago: once its block is copied out of the slab, a
// read is served from that copy while the file is written; then from the file.
TEST(KvDiskTier, AKeyWaitingToBeWrittenIsReadFromItsCopy) {
  TierDir dir;
  Source src(2);
  auto tier = *KvDiskTier::Open(dir.path, 1 << 20);
  auto w = tier->BeginWrite("test", "k1", kBlock, kBlock);
  ASSERT_TRUE(w.has_value());
  w->slab = std::make_shared<const ipc::UniqueFd>(::fcntl(src.fd, F_DUPFD_CLOEXEC, 0));
  w->offset = kBlock;
  EXPECT_FALSE(tier->BeginRead("test", "k1", kBlock).has_value());  // not copied out yet: the get waits
  EXPECT_TRUE(tier->BeingWritten("test", "k1"));
  ASSERT_TRUE(KvDiskTier::Copy(*w).ok());
  tier->Copied(*w);
  std::vector<std::byte> got(kBlock);
  auto r = tier->BeginRead("test", "k1", kBlock);
  ASSERT_TRUE(r.has_value());
  EXPECT_NE(r->copy, nullptr);
  auto n = KvDiskTier::Perform(*r, got.data());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(*n, kBlock);
  EXPECT_EQ(std::to_integer<char>(got[kBlock - 1]), 'b');
  tier->EndRead(*r, n);
  EXPECT_EQ(tier->stats().promoted, 1u);

  ASSERT_TRUE(KvDiskTier::Perform(*w).ok());
  tier->EndWrite(*w, Status::Ok());
  EXPECT_EQ(tier->stats().writing, 0u);
  r = tier->BeginRead("test", "k1", kBlock);
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->copy, nullptr);  // from the file now
  std::fill(got.begin(), got.end(), std::byte{0});
  n = KvDiskTier::Perform(*r, got.data());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(std::to_integer<char>(got[0]), 'b');
  tier->EndRead(*r, n);

  // A write that fails after its copy was read from: the key is gone from the tier.
  auto failing = tier->BeginWrite("test", "k0", kBlock, kBlock);
  ASSERT_TRUE(failing.has_value());
  failing->slab = std::make_shared<const ipc::UniqueFd>(::fcntl(src.fd, F_DUPFD_CLOEXEC, 0));
  ASSERT_TRUE(KvDiskTier::Copy(*failing).ok());
  tier->Copied(*failing);
  auto reading = tier->BeginRead("test", "k0", kBlock);
  ASSERT_TRUE(reading.has_value());
  tier->EndWrite(*failing, Status(ErrorCode::kInternal, "disk full"));
  EXPECT_FALSE(tier->Has("test", "k0"));
  n = KvDiskTier::Perform(*reading, got.data());  // (the read holds its copy)
  ASSERT_TRUE(n.ok());
  EXPECT_EQ(std::to_integer<char>(got[0]), 'a');
  tier->EndRead(*reading, n);
  EXPECT_EQ(tier->stats().writing, 0u);
  EXPECT_EQ(tier->stats().blocks, 1u);
}

bool Exists(const std::string& path) { return ::access(path.c_str(), F_OK) == 0; }

// One broker per directory, and a take-over's hand-over of it: the new
// broker's first scan leaves the old one's unfinished writes alone, and once
// it has the old one's lock it finds what the old one wrote and removed since.
TEST(KvDiskTier, OneBrokerPerDirectoryAndATakeOverHandsTheLockOver) {
  TierDir dir;
  Source src(4);
  auto old_tier = *KvDiskTier::Open(dir.path, 1 << 20);
  ASSERT_TRUE(Spill(*old_tier, src, 0, "k0").ok());
  ASSERT_TRUE(Spill(*old_tier, src, 1, "k1").ok());
  auto second = KvDiskTier::Open(dir.path, 1 << 20);
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), ErrorCode::kBusy);
  EXPECT_NE(second.status().message().find("another running broker"), std::string::npos);

  // The old broker is writing k2 when the new one starts.
  auto writing = old_tier->BeginWrite("test", "k2", kBlock, kBlock);
  ASSERT_TRUE(writing.has_value());
  writing->slab = std::make_shared<const ipc::UniqueFd>(::fcntl(src.fd, F_DUPFD_CLOEXEC, 0));
  writing->offset = 2 * kBlock;
  ASSERT_TRUE(KvDiskTier::Copy(*writing).ok());
  const std::string unfinished = writing->temporary;
  ipc::UniqueFd partial(::open(unfinished.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600));
  ASSERT_TRUE(partial.valid());
  auto new_tier = KvDiskTier::Open(dir.path, 1 << 20, /*taking_over=*/true);
  ASSERT_TRUE(new_tier.ok()) << new_tier.status().ToString();
  EXPECT_TRUE(Exists(unfinished));  // the old broker's, still being written
  EXPECT_TRUE((*new_tier)->Has("test", "k0"));
  EXPECT_FALSE((*new_tier)->Has("test", "k2"));

  // Meanwhile the old broker finishes k2 and removes k0 (a trim, a damaged
  // file); then it hands over, its lock with it.
  ::unlink(unfinished.c_str());
  ASSERT_TRUE(KvDiskTier::Perform(*writing).ok());
  old_tier->EndWrite(*writing, Status::Ok());
  std::string k0;
  for (const auto& e : std::filesystem::recursive_directory_iterator(dir.path))
    if (e.path().filename().string().rfind(std::string("6b30."), 0) == 0) k0 = e.path();  // "k0" in hex
  ASSERT_FALSE(k0.empty());
  ASSERT_EQ(::unlink(k0.c_str()), 0);
  const std::string leftover = unfinished.substr(0, unfinished.rfind('/')) + "/.tmp-999";
  ipc::UniqueFd(::open(leftover.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600)).reset();
  ASSERT_TRUE(Exists(leftover));
  ASSERT_TRUE((*new_tier)->TakeOver(ipc::UniqueFd(::fcntl(old_tier->lock_fd(), F_DUPFD_CLOEXEC, 0))).ok());
  EXPECT_TRUE((*new_tier)->Has("test", "k2"));
  EXPECT_TRUE((*new_tier)->Has("test", "k1"));
  EXPECT_FALSE((*new_tier)->Has("test", "k0"));
  EXPECT_EQ((*new_tier)->stats().blocks, 2u);
  EXPECT_FALSE(Exists(leftover));  // an unfinished write nobody will finish
  std::vector<std::byte> got(kBlock);
  auto r = (*new_tier)->BeginRead("test", "k2", kBlock);
  ASSERT_TRUE(r.has_value());
  auto n = KvDiskTier::Perform(*r, got.data());
  ASSERT_TRUE(n.ok()) << n.status().ToString();
  EXPECT_EQ(std::to_integer<char>(got[0]), 'c');
  (*new_tier)->EndRead(*r, n);

  // The old broker exits: the new one holds the lock on.
  old_tier.reset();
  auto third = KvDiskTier::Open(dir.path, 1 << 20);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), ErrorCode::kBusy);
  // A take-over from a broker without this tier takes the lock itself: BUSY
  // while another has it.
  auto fourth = KvDiskTier::Open(dir.path, 1 << 20, true);
  ASSERT_TRUE(fourth.ok());
  EXPECT_EQ((*fourth)->TakeOver(ipc::UniqueFd()).code(), ErrorCode::kBusy);
  new_tier->reset();
  EXPECT_TRUE((*fourth)->TakeOver(ipc::UniqueFd()).ok());
  EXPECT_EQ((*fourth)->stats().blocks, 2u);
}

// A batch's keys share one buffer: each key keeps its own bytes and bounds
// (keys that join to the same bytes differ), through encode and decode.
TEST(KvWire, KeysKeepTheirBoundsInOneBuffer) {
  const std::vector<std::string> given = {"ab", std::string("\0k", 2), std::string(ipc::kMaxKvKeyBytes, '\xff'), "c"};
  const ipc::KvKeys keys(given);
  ASSERT_EQ(keys.size(), given.size());
  std::vector<std::string> seen;
  for (std::string_view k : keys) seen.emplace_back(k);
  EXPECT_EQ(seen, given);
  EXPECT_EQ(keys[1], std::string_view("\0k", 2));
  EXPECT_NE((ipc::KvKeys{"ab", "c"}), (ipc::KvKeys{"a", "bc"}));
  EXPECT_EQ((ipc::KvKeys{"ab", "c"}), (ipc::KvKeys(std::vector<std::string>{"ab", "c"})));
  auto decoded = ipc::Decode(ipc::Encode({ipc::kProtocolVersion, 1, 0, ipc::KvGetRequest{1, keys, true}}));
  ASSERT_TRUE(decoded.ok()) << decoded.status().ToString();
  EXPECT_EQ(std::get<ipc::KvGetRequest>(decoded->body).keys, keys);
}

// Keys are sent packed (their bytes, and where each ends); a client from
// before sent a table per key, and a broker reads both the same.
TEST(KvWire, PackedKeysAreCheckedAndTheOldFormIsRead) {
  const ipc::Envelope get{ipc::kProtocolVersion, 1, 0, ipc::KvGetRequest{1, {"ab", "cd"}, true}};
  const ipc::Envelope reserve{ipc::kProtocolVersion, 2, 0, ipc::KvReserveRequest{1, {"ab", "cd"}}};
  for (const ipc::Envelope& env : {get, reserve}) {
    auto old = ipc::Decode(ipc::EncodeWithKeyTables(env));
    ASSERT_TRUE(old.ok()) << old.status().ToString();
    EXPECT_EQ(*old, env);
    EXPECT_NE(ipc::EncodeWithKeyTables(env), ipc::Encode(env));
  }
  // key_ends [2, 4] in the frame, patched: out of order, past the bytes, short of them, an empty key.
  const std::vector<uint8_t> frame = ipc::Encode(get);
  const uint8_t ends[] = {2, 0, 0, 0, 4, 0, 0, 0};
  auto at = std::search(frame.begin(), frame.end(), std::begin(ends), std::end(ends));
  ASSERT_NE(at, frame.end());
  ASSERT_EQ(std::search(at + 1, frame.end(), std::begin(ends), std::end(ends)), frame.end());
  const size_t off = static_cast<size_t>(at - frame.begin());
  const std::pair<std::array<uint8_t, 2>, const char*> bad[] = {{{4, 2}, "out of order"},
                                                                  {{2, 5}, "past the keys' bytes"},
                                                                  {{2, 3}, "past the last key"},
                                                                  {{0, 4}, "an empty key"}};
  for (const auto& [patch, why] : bad) {
    std::vector<uint8_t> f = frame;
    f[off] = patch[0];
    f[off + 4] = patch[1];
    auto r = ipc::Decode(f);
    ASSERT_EQ(r.status().code(), ErrorCode::kProtocolError) << why;
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }
}

TEST(KvWire, BatchesAndKeysAreCapped) {
  using ipc::Decode;
  using ipc::Encode;
  auto decode = [](ipc::Message m) { return Decode(Encode({ipc::kProtocolVersion, 1, 0, std::move(m)})); };
  std::vector<std::string> many(ipc::kMaxKvBatch + 1, "k");
  EXPECT_EQ(decode(ipc::KvGetRequest{1, many, true}).status().code(), ErrorCode::kProtocolError);
  many.pop_back();
  EXPECT_TRUE(decode(ipc::KvGetRequest{1, many, true}).ok());
  EXPECT_EQ(decode(ipc::KvReserveRequest{1, {std::string(65, 'k')}}).status().code(), ErrorCode::kProtocolError);
  EXPECT_EQ(decode(ipc::KvReserveRequest{1, {""}}).status().code(), ErrorCode::kProtocolError);
  std::vector<ipc::KvRef> refs(ipc::kMaxKvBatch + 1);
  EXPECT_EQ(decode(ipc::KvReleaseRequest{1, refs}).status().code(), ErrorCode::kProtocolError);
  EXPECT_EQ(decode(ipc::KvBlocksReply{{}, 1}).status().code(), ErrorCode::kProtocolError);
  // The largest batch of the longest keys fits in one frame.
  std::vector<std::string> longest(ipc::kMaxKvBatch, std::string(ipc::kMaxKvKeyBytes, 'k'));
  EXPECT_TRUE(decode(ipc::KvGetRequest{1, longest, true}).ok());
}

}  // namespace
}  // namespace membroker::broker
