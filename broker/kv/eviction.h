// Eviction policies of a KV store (kv/block_store.h): which sealed block
// goes when the store passes its high watermark. Both see the same events -
// a block sealed, a block read, a block gone for another reason - and answer
// Victim() with a block that `evictable` accepts (leased blocks are not).
//
//  - S3Fifo (the default; Yang et al., SOSP 2023): a small FIFO that new
//    blocks enter, a main FIFO for those read again while in it, and a ghost
//    FIFO of recently evicted keys (a key sealed again while its ghost is
//    there enters main at once). A scan - blocks read once - passes through
//    the small FIFO and leaves without pushing the reused blocks out of main.
//  - Lru: least recently used first, for comparison (bench/kv_eviction.cc).
//
// Slots are the store's block indices; a policy keeps no pointers into the
// store. Every call is O(1) amortised; Victim skips what it may not evict,
// moving it on, at most twice round its queues.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <optional>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace membroker::broker {

enum class EvictionKind : uint8_t { kS3Fifo = 0, kLru = 1 };
std::string_view EvictionName(EvictionKind kind);

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  // A block was sealed in slot under a key whose hash is key_hash.
  virtual void Inserted(uint64_t slot, uint64_t key_hash) = 0;
  // The block in slot was read (a hit).
  virtual void Accessed(uint64_t slot) = 0;
  // The block in slot is gone (evicted by the caller, or its store dropped it).
  virtual void Removed(uint64_t slot) = 0;
  // The slot to evict next, or none when no block is evictable.
  virtual std::optional<uint64_t> Victim(const std::function<bool(uint64_t)>& evictable) = 0;
  virtual size_t size() const = 0;  // blocks it tracks

  static std::unique_ptr<EvictionPolicy> Make(EvictionKind kind, uint64_t capacity_blocks);
};

class S3Fifo final : public EvictionPolicy {
 public:
  explicit S3Fifo(uint64_t capacity_blocks);
  void Inserted(uint64_t slot, uint64_t key_hash) override;
  void Accessed(uint64_t slot) override;
  void Removed(uint64_t slot) override;
  std::optional<uint64_t> Victim(const std::function<bool(uint64_t)>& evictable) override;
  size_t size() const override { return small_count_ + main_count_; }

 private:
  enum class Where : uint8_t { kNone, kSmall, kMain };
  struct Entry {
    Where where = Where::kNone;
    uint8_t freq = 0;  // reads while queued, capped at 3
    uint64_t key_hash = 0;
    uint64_t stamp = 0;  // which queue entry is the live one (older ones are skipped)
  };
  struct Queued {
    uint64_t slot;
    uint64_t stamp;
  };
  bool Live(const Queued& q, Where where) const;
  void Push(std::deque<Queued>& q, uint64_t slot, Where where);
  void Remember(uint64_t key_hash);  // into the ghost FIFO

  std::vector<Entry> entries_;  // by slot
  std::deque<Queued> small_, main_;
  size_t small_count_ = 0, main_count_ = 0;  // live entries in each
  size_t small_target_;                      // 10% of the capacity
  std::deque<uint64_t> ghost_;               // evicted keys' hashes, oldest first
  std::unordered_map<uint64_t, uint32_t> ghost_count_;
  size_t ghost_capacity_;
  uint64_t next_stamp_ = 1;
};

class Lru final : public EvictionPolicy {
 public:
  explicit Lru(uint64_t capacity_blocks) : where_(capacity_blocks, order_.end()) {}
  void Inserted(uint64_t slot, uint64_t key_hash) override;
  void Accessed(uint64_t slot) override;
  void Removed(uint64_t slot) override;
  std::optional<uint64_t> Victim(const std::function<bool(uint64_t)>& evictable) override;
  size_t size() const override { return order_.size(); }

 private:
  std::list<uint64_t> order_;  // least recently used first
  std::vector<std::list<uint64_t>::iterator> where_;
};

}  // namespace membroker::broker
