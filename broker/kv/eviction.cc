// Eviction policies (eviction.h).
#include "kv/eviction.h"

#include <algorithm>

namespace membroker::broker {

std::string_view EvictionName(EvictionKind kind) { return kind == EvictionKind::kLru ? "lru" : "s3fifo"; }

std::unique_ptr<EvictionPolicy> EvictionPolicy::Make(EvictionKind kind, uint64_t capacity_blocks) {
  if (kind == EvictionKind::kLru) return std::make_unique<Lru>(capacity_blocks);
  return std::make_unique<S3Fifo>(capacity_blocks);
}

// ---- S3-FIFO ----

S3Fifo::S3Fifo(uint64_t capacity_blocks)
    : entries_(capacity_blocks),
      small_target_(std::max<uint64_t>(1, capacity_blocks / 10)),
      ghost_capacity_(std::max<uint64_t>(1, capacity_blocks - capacity_blocks / 10)) {}

bool S3Fifo::Live(const Queued& q, Where where) const {
  const Entry& e = entries_[q.slot];
  return e.where == where && e.stamp == q.stamp;
}

void S3Fifo::Push(std::deque<Queued>& q, uint64_t slot, Where where) {
  Entry& e = entries_[slot];
  e.where = where;
  e.stamp = next_stamp_++;
  q.push_back({slot, e.stamp});
  size_t& live = where == Where::kSmall ? small_count_ : main_count_;
  live += 1;
  // Entries of removed blocks wait in the queue until reached; with many
  // removals and few evictions, drop them now so a queue stays O(live).
  if (q.size() > 2 * live + 64) std::erase_if(q, [&](const Queued& x) { return !Live(x, where); });
}

void S3Fifo::Remember(uint64_t key_hash) {
  ghost_.push_back(key_hash);
  ++ghost_count_[key_hash];
  while (ghost_.size() > ghost_capacity_) {
    auto it = ghost_count_.find(ghost_.front());
    if (--it->second == 0) ghost_count_.erase(it);
    ghost_.pop_front();
  }
}

void S3Fifo::Inserted(uint64_t slot, uint64_t key_hash) {
  Removed(slot);  // (a slot is only inserted free; this keeps the counts right if not)
  Entry& e = entries_[slot];
  e.freq = 0;
  e.key_hash = key_hash;
  // A key evicted a short while ago was wanted again: main at once. Its ghost
  // stays in the FIFO and ages out there (ghost_count_ counts the FIFO's entries).
  if (ghost_count_.count(key_hash) != 0) {
    Push(main_, slot, Where::kMain);
  } else {
    Push(small_, slot, Where::kSmall);
  }
}

void S3Fifo::Accessed(uint64_t slot) {
  Entry& e = entries_[slot];
  if (e.where != Where::kNone && e.freq < 3) ++e.freq;
}

void S3Fifo::Removed(uint64_t slot) {
  Entry& e = entries_[slot];
  if (e.where == Where::kSmall) --small_count_;
  if (e.where == Where::kMain) --main_count_;
  e.where = Where::kNone;  // its queue entry is skipped when reached
}

std::optional<uint64_t> S3Fifo::Victim(const std::function<bool(uint64_t)>& evictable) {
  // Each live entry is looked at most a few times (a read moves a block to
  // main or lowers its count; an unevictable one goes round): a bound on the
  // work, so a store whose every block is leased answers "none" in O(n).
  size_t budget = 4 * (small_count_ + main_count_) + 4;
  // Unevictable blocks of the small FIFO passed over in a row: once round it,
  // main is looked at even if small is above its target (every new block may
  // be leased, and main's blocks are still evictable).
  size_t small_passed = 0;
  while (budget-- > 0 && (small_count_ + main_count_) > 0) {
    const bool from_small =
        main_count_ == 0 || (small_count_ > small_target_ && small_passed < small_count_);
    std::deque<Queued>& q = from_small ? small_ : main_;
    const Where where = from_small ? Where::kSmall : Where::kMain;
    while (!q.empty() && !Live(q.front(), where)) q.pop_front();  // entries of removed blocks
    if (q.empty()) continue;
    const uint64_t slot = q.front().slot;
    q.pop_front();
    Entry& e = entries_[slot];
    (from_small ? small_count_ : main_count_) -= 1;
    e.where = Where::kNone;
    if (!evictable(slot)) {
      Push(q, slot, where);  // leased or being read: round again
      if (from_small) ++small_passed;
      continue;
    }
    if (from_small && e.freq > 0) {
      e.freq = 0;
      Push(main_, slot, Where::kMain);  // read again while new: it is worth keeping
      continue;
    }
    if (!from_small && e.freq > 0) {
      --e.freq;
      Push(main_, slot, Where::kMain);
      continue;
    }
    if (from_small) Remember(e.key_hash);
    return slot;
  }
  return std::nullopt;
}

// ---- LRU ----

void Lru::Inserted(uint64_t slot, uint64_t) {
  Removed(slot);
  where_[slot] = order_.insert(order_.end(), slot);
}

void Lru::Accessed(uint64_t slot) {
  if (where_[slot] != order_.end()) order_.splice(order_.end(), order_, where_[slot]);
}

void Lru::Removed(uint64_t slot) {
  if (where_[slot] == order_.end()) return;
  order_.erase(where_[slot]);
  where_[slot] = order_.end();
}

std::optional<uint64_t> Lru::Victim(const std::function<bool(uint64_t)>& evictable) {
  for (auto it = order_.begin(); it != order_.end(); ++it) {
    if (!evictable(*it)) continue;
    const uint64_t slot = *it;
    Removed(slot);
    return slot;
  }
  return std::nullopt;
}

}  // namespace membroker::broker
