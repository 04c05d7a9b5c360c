// SlotCounts (broker/kv/slot_counts.h) against std::unordered_map: the same
// operations, the same contents, through growth and erases that shift runs
// back across the table's end.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "kv/slot_counts.h"

namespace membroker::broker {
namespace {

std::map<uint64_t, uint32_t> Contents(const SlotCounts& c) {
  std::map<uint64_t, uint32_t> out;
  c.ForEach(
      [&](uint64_t slot, uint32_t n) { EXPECT_TRUE(out.emplace(slot, n).second) << "slot " << slot << " twice"; });
  return out;
}

TEST(SlotCounts, MatchesAMapThroughInsertsAndErases) {
  std::mt19937_64 random(7);
  for (uint64_t range : {8ull, 64ull, 1000ull, 100000ull}) {  // few slots: long runs and wrap-around
    SlotCounts counts;
    std::map<uint64_t, uint32_t> model;
    for (int op = 0; op < 20000; ++op) {
      const uint64_t slot = random() % range;
      if (random() % 3 != 0) {
        ++counts[slot];
        ++model[slot];
      } else {
        uint32_t* mine = counts.Find(slot);
        ASSERT_EQ(mine != nullptr, model.count(slot) != 0) << "slot " << slot;
        if (mine != nullptr && --*mine == 0) counts.Erase(slot);
        if (auto it = model.find(slot); it != model.end() && --it->second == 0) model.erase(it);
      }
      ASSERT_EQ(counts.size(), model.size());
      if (op % 997 == 0) {
        ASSERT_EQ(Contents(counts), model) << "range " << range << ", after " << op;
      }
    }
    ASSERT_EQ(Contents(counts), model);
    for (const auto& [slot, n] : model) counts.Erase(slot);
    EXPECT_TRUE(counts.empty());
    EXPECT_EQ(counts.Find(0), nullptr);
  }
}

TEST(SlotCounts, AnEmptyTableFindsNothing) {
  SlotCounts counts;
  EXPECT_EQ(counts.Find(3), nullptr);
  counts.Erase(3);
  EXPECT_TRUE(counts.empty());
}

}  // namespace
}  // namespace membroker::broker
