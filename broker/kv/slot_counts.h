// SlotCounts: one session's leases in one store, slot -> count, in one array
// (open addressing with linear probing; an erase shifts the rest of its run
// back, so there are no tombstones). A get of 64 blocks and its release add
// and remove 64 entries; std::unordered_map made and freed a heap node for
// each, about a fifth of the broker's instructions per get (callgrind,
// bench_script --op kv_get64). The array stays, as the map's buckets did,
// until the session ends.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace membroker::broker {

class SlotCounts {
 public:
  // The slot's count, made 0 if it had none.
  uint32_t& operator[](uint64_t slot) {
    if ((size_ + 1) * 4 > table_.size() * 3) Grow();  // at most 3/4 full: runs stay short
    size_t i = Home(slot);
    while (table_[i].slot != kEmpty && table_[i].slot != slot) i = Next(i);
    if (table_[i].slot == kEmpty) {
      table_[i] = {slot, 0};
      ++size_;
    }
    return table_[i].count;
  }
  // The slot's count, or null if it has none.
  uint32_t* Find(uint64_t slot) {
    const size_t i = IndexOf(slot);
    return i == kNone ? nullptr : &table_[i].count;
  }
  void Erase(uint64_t slot) {
    size_t hole = IndexOf(slot);
    if (hole == kNone) return;
    // Each later entry of the run whose home is not cyclically in (hole, j]
    // moves into the hole (it would not be found past it otherwise).
    for (size_t j = Next(hole); table_[j].slot != kEmpty; j = Next(j)) {
      const size_t home = Home(table_[j].slot);
      const bool between = hole < j ? (hole < home && home <= j) : (hole < home || home <= j);
      if (!between) {
        table_[hole] = table_[j];
        hole = j;
      }
    }
    table_[hole] = Entry{};
    --size_;
  }
  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  template <typename F>
  void ForEach(F&& f) const {  // f(slot, count), in no particular order
    for (const Entry& e : table_)
      if (e.slot != kEmpty) f(e.slot, e.count);
  }

 private:
  static constexpr uint64_t kEmpty = UINT64_MAX;  // (no store has that many slots)
  static constexpr size_t kNone = SIZE_MAX;
  struct Entry {
    uint64_t slot = kEmpty;
    uint32_t count = 0;
  };
  // Fibonacci hashing into a power-of-two table: a batch's consecutive slots spread.
  size_t Home(uint64_t slot) const { return static_cast<size_t>((slot * 0x9E3779B97F4A7C15ull) >> shift_); }
  size_t Next(size_t i) const { return (i + 1) & (table_.size() - 1); }
  size_t IndexOf(uint64_t slot) const {
    if (table_.empty()) return kNone;
    for (size_t i = Home(slot);; i = Next(i)) {
      if (table_[i].slot == slot) return i;
      if (table_[i].slot == kEmpty) return kNone;
    }
  }
  void Grow() {
    std::vector<Entry> old(table_.empty() ? 16 : table_.size() * 2);
    old.swap(table_);
    shift_ = 64;
    for (size_t n = table_.size(); n > 1; n >>= 1) --shift_;
    size_ = 0;
    for (const Entry& e : old)
      if (e.slot != kEmpty) (*this)[e.slot] = e.count;
  }

  std::vector<Entry> table_;
  size_t size_ = 0;
  int shift_ = 64;
};

}  // namespace membroker::broker
