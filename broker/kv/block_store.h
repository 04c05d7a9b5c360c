// BlockStore: one named KV-cache store (docs/KV.md). Fixed-size blocks found
// by opaque keys, in slabs of memory only this broker writes (memfd.h's
// `writable`): clients map a slab once, read-only, and the kernel refuses
// them any writable fd or mapping of it. A block is put in two phases -
// Reserve takes a free slot for the key (invisible: the key is being
// written), Seal has the broker copy the writer's bytes from an allocation
// the writer holds into the slot (visible, immutable) - and read under
// leases: a leased block is never evicted, so its slot is not reused.
//
// Rules:
//  1. A key is in at most one slot, writing or sealed; Reserve answers
//     ALREADY_EXISTS for a sealed key and BUSY for one being written.
//  2. A slot's generation changes whenever the slot is given to a key: a
//     (slot, generation) reference to a block evicted and reused is STALE,
//     never another key's bytes.
//  3. A client's leases and reservations end when its session does
//     (OnSessionEnd), however it ended.
//  4. Eviction starts when a Reserve finds the store at its high watermark
//     (95% of the blocks) and takes unleased sealed blocks, in the policy's
//     order (eviction.h), down to the low one (90%; at least one free).
//  5. With a disk tier (disk_tier.h), an evicted block the tier does not
//     have yet keeps its slot until a worker has written it out
//     (TakeEvicted, Spilled): a Reserve that finds no free slot while blocks
//     are being written out waits for them (spilling()); a get promotes a
//     key from the disk into a slot (BeginPromote, EndPromote).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kv/eviction.h"
#include "kv/kv_index.h"
#include "kv/slot_counts.h"
#include "kv/store_spec.h"
#include "memory/memfd.h"
#include "membroker/ipc/protocol.h"
#include "membroker/status.h"

namespace membroker::broker {

inline constexpr uint64_t kKvSlabTargetBytes = 64ull << 20;  // a slab holds ~64 MiB of blocks
inline constexpr uint64_t kKvMaxBlockBytes = 256ull << 20;
inline constexpr uint64_t kKvMinBlockBytes = 64;
inline constexpr uint32_t kKvMaxSlabs = 4096;
inline constexpr size_t kKvMaxStores = 64;
// Leases one client may hold on one block at once (a count, so a client that
// never releases cannot overflow it; the lease table's size is bounded by the
// blocks).
inline constexpr uint32_t kKvMaxLeasesPerBlock = 1u << 16;

struct KvStoreStats {
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t sealed = 0;   // blocks sealed so far
  uint64_t aborted = 0;  // reservations aborted or ended with their client
  uint64_t evictions = 0;
  uint64_t exhausted = 0;     // reservations refused: every block leased or being written
  uint64_t stale = 0;         // STALE answers
  uint64_t bytes_copied = 0;  // by Seal
  uint64_t restored = 0;      // sealed blocks an earlier broker had, made again here
  uint64_t lost = 0;          // sealed blocks of an earlier broker not made again (damaged, missing)
  uint64_t spilled = 0;       // evicted blocks handed to the disk tier
  uint64_t disk_hits = 0;     // blocks promoted from the disk tier (also counted in hits)
  KvStoreStats& operator+=(const KvStoreStats& o);
};

class BlockStore {
 public:
  // Checks the spec (PARAM_INVALID, saying why) and makes the slabs.
  static Result<std::unique_ptr<BlockStore>> Create(uint64_t id, KvStoreSpec spec, uint64_t generation = 0);
  // A store made again from an earlier broker's (a take-over, a restart
  // from systemd's fd store): its index and its slabs' fds, by slab number
  // (an invalid fd for a slab that did not come). The slabs are new memory
  // with the sealed blocks copied in, slot for slot, with their generations:
  // the old slabs were sealed against writes for good, so no broker can
  // write them again. A slab's fd is closed once its blocks are copied.
  // Blocks whose record is damaged, whose slab is missing or short, or whose
  // key came twice are dropped and counted.
  struct Restored {
    std::unique_ptr<BlockStore> store;
    uint64_t blocks = 0;   // sealed blocks back
    uint64_t dropped = 0;  // sealed blocks lost, and damaged records
  };
  // The new store's generation is `generation` (above every earlier set's).
  static Result<Restored> Restore(const KvIndex::Contents& index, std::vector<ipc::UniqueFd> slabs,
                                  uint64_t generation);
  ~BlockStore();
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;

  uint64_t id() const { return id_; }
  // How many restarts the store went through (its fds' names in systemd's
  // fd store carry it, so an old set and a new one never share a name).
  uint64_t generation() const { return generation_; }
  const KvStoreSpec& spec() const { return spec_; }
  ipc::KvStoreReply Describe() const;
  uint64_t bytes() const;  // the slabs' memory, as charged
  uint64_t page_size() const;
  uint32_t slab_count() const { return static_cast<uint32_t>(slabs_.size()); }
  // A read-only fd of slab i (PARAM_INVALID past the last), and its memory's
  // size: its blocks rounded up to its page size (what a reader maps).
  Result<int> SlabFd(uint32_t slab) const;
  uint64_t SlabBytes(uint32_t slab) const { return slab < slabs_.size() ? slabs_[slab].mem.size : 0; }
  // The index's fd (kv_index.h): for the next broker only, never a client.
  int index_fd() const { return records_.fd(); }

  ipc::KvBlock Reserve(uint64_t session, std::string_view key);
  // Copies [seal.offset, seal.offset + seal.length) of src_fd into the block
  // the session reserved, and the key becomes visible.
  ipc::KvBlock Seal(uint64_t session, const ipc::KvSeal& seal, int src_fd);
  // The same in three steps, so that the copy runs on a worker thread:
  // BeginCopy checks the seal as Seal does and, if it may go ahead, answers
  // where to copy to (the slot is not given to another key until EndCopy,
  // even if the writer aborts or ends meanwhile); CopyInto does the copy (any
  // thread); EndCopy seals the block if the copy succeeded and the writer
  // still holds the reservation.
  ipc::KvBlock BeginCopy(uint64_t session, const ipc::KvSeal& seal, std::byte** to);
  static ErrorCode CopyInto(std::byte* to, int src_fd, uint64_t offset, uint64_t length);
  ipc::KvBlock EndCopy(uint64_t session, const ipc::KvSeal& seal, ErrorCode copied);
  ErrorCode Abort(uint64_t session, const ipc::KvRef& ref);
  // NOT_FOUND for a key not sealed (absent or being written). newly_held:
  // set when this lease is the session's first on the block (HeldBlocks grew).
  ipc::KvBlock Get(uint64_t session, std::string_view key, bool lease, bool* newly_held = nullptr);
  // The key is in memory, sealed or being written or promoted.
  bool Knows(std::string_view key) const { return index_.find(key) != index_.end(); }

  // The disk tier (rule 5): from now on, an evicted block whose key
  // `unwritten` accepts is held back for it.
  void HoldEvicted(std::function<bool(const std::string& key)> unwritten) { unwritten_ = std::move(unwritten); }
  bool spilling() const { return !spilling_.empty(); }
  // Evicts until n slots are free or being freed (a batch's room at once:
  // with a disk tier, each round of waiting for blocks to be copied out
  // costs a worker's round trip).
  void MakeRoom(uint64_t n);
  uint64_t free_slots() const { return free_.size(); }
  struct Evicted {
    uint64_t slot = 0;
    std::string key;
    uint64_t length = 0;
    uint32_t slab = 0;
    uint64_t offset = 0;  // in the slab
  };
  // The blocks evicted since the last call, each held back until Spilled.
  std::vector<Evicted> TakeEvicted() { return std::exchange(evicted_, {}); }
  // The slot's block was written out (written) or not: the slot is free again.
  void Spilled(uint64_t slot, bool written);
  // Takes a slot for a key read from the disk (none: RESOURCE_EXHAUSTED);
  // invisible until EndPromote seals it with the length read - leased for
  // `lease_for` unless that is 0, and counted a hit - or frees it (NOT_FOUND).
  ipc::KvBlock BeginPromote(std::string_view key, std::byte** to);
  ipc::KvBlock EndPromote(const ipc::KvBlock& begun, const Result<uint64_t>& length, uint64_t lease_for);
  ErrorCode Release(uint64_t session, const ipc::KvRef& ref);
  void OnSessionEnd(uint64_t session);

  bool InUse() const;
  uint64_t used_blocks() const { return used_; }
  uint64_t sealed_blocks() const { return used_ - writing_blocks_ - promoting_blocks_; }
  uint64_t writing_blocks() const { return writing_blocks_; }
  uint64_t leases_held() const;
  const KvStoreStats& stats() const { return stats_; }
  // Blocks the session holds: leased (each once, however many leases) or reserved.
  uint64_t HeldBlocks(uint64_t session) const;
  // Sessions holding leases or reservations here: (leases, reservations).
  std::map<uint64_t, std::pair<uint64_t, uint64_t>> BySession() const;
  // The index against the slots, the free list, the leases and the policy.
  Status Check() const;

 private:
  // Create's, with `fill` called for each new slab's fd before it is sealed
  // (CreatePhysicalMemory's fill).
  using SlabFill = std::function<Status(uint64_t slab, int fd)>;
  static Result<std::unique_ptr<BlockStore>> Make(uint64_t id, KvStoreSpec spec, uint64_t generation,
                                                  const SlabFill& fill);
  enum class State : uint8_t { kFree, kWriting, kSealed, kPromoting };
  struct Slot {
    State state = State::kFree;
    uint64_t generation = 0;  // 0: never used (no reference names generation 0)
    uint64_t length = 0;
    uint32_t leases = 0;
    uint64_t writer = 0;  // the session, while kWriting
    std::string key;
  };
  struct Slab {
    PhysicalMemory mem;
    UniqueFd read_only;
    std::byte* base = nullptr;  // the broker's writable mapping
  };
  BlockStore(uint64_t id, KvStoreSpec spec);
  bool Refers(const ipc::KvRef& ref) const {
    return ref.slot < slots_.size() && slots_[ref.slot].generation == ref.generation && ref.generation != 0;
  }
  ipc::KvBlock BlockOf(ErrorCode code, uint64_t slot) const;
  void EvictToLowWatermark();
  // Orders the slots freed from free_[from] on so that the lowest is taken
  // first: the next batch's blocks then lie in ascending order, and reading
  // 256 blocks of 16 KiB in that order took half the time of the reverse
  // order here (the order evictions free them in, pushed and taken from the back).
  void LowestFirst(size_t from);
  bool EvictOne();
  // A free slot for a new block (evicting if the store is full), or none.
  std::optional<uint64_t> TakeSlot();
  // TakeSlot, given to key in state (a new generation), or none.
  std::optional<uint64_t> Claim(std::string_view key, State state);
  void Free(uint64_t slot);
  void Unhold(uint64_t slot);
  std::byte* Address(uint64_t slot) const;
  // The slot's record in the index, as the slot is now.
  void Record(uint64_t slot);

  uint64_t id_;
  uint64_t generation_ = 0;
  KvStoreSpec spec_;
  uint64_t slab_blocks_ = 0;
  uint64_t high_ = 0, low_ = 0;  // watermarks, in blocks
  std::vector<Slab> slabs_;
  KvIndex records_;  // the slots as a next broker reads them
  std::vector<Slot> slots_;
  std::vector<uint64_t> free_;  // slots, taken from the back
  std::set<uint64_t> copying_;  // slots a worker copies into (BeginCopy to EndCopy, promotions)
  std::set<uint64_t> spilling_;  // evicted slots a worker writes out to the disk tier
  std::set<uint64_t> held_back_;  // free, but not in free_ until their copy or spill ends
  std::function<bool(const std::string&)> unwritten_;  // none: no disk tier
  std::vector<Evicted> evicted_;
  uint64_t used_ = 0;           // slots writing, promoting or sealed
  uint64_t writing_blocks_ = 0;
  uint64_t promoting_blocks_ = 0;
  struct KeyHash {  // (a batch's keys are views: looked up without a copy)
    using is_transparent = void;
    size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
  };
  std::unordered_map<std::string, uint64_t, KeyHash, std::equal_to<>> index_;  // key -> slot (writing or sealed)
  std::unique_ptr<EvictionPolicy> policy_;
  // session -> slot -> leases. A session's table is kept, empty, until the
  // session ends: a batch's leases come and go at every get.
  std::map<uint64_t, SlotCounts> leases_;
  std::map<uint64_t, std::set<uint64_t>> writing_;           // session -> slots it reserved
  KvStoreStats stats_;
};

}  // namespace membroker::broker
