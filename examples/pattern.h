// The byte pattern the examples write and check: word i of a buffer holds
// i * kPatternMultiplier + seed, so a wrong, shifted or stale page shows up.
#pragma once

#include <cstddef>
#include <cstdint>

namespace membroker::examples {

inline constexpr uint64_t kPatternMultiplier = 0x9e3779b97f4a7c15ull;

inline void FillPattern(void* p, size_t bytes, uint64_t seed) {
  auto* w = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i) w[i] = i * kPatternMultiplier + seed;
}

// Returns the index of the first wrong word, or SIZE_MAX if all match.
inline size_t CheckPattern(const void* p, size_t bytes, uint64_t seed) {
  const auto* w = static_cast<const uint64_t*>(p);
  for (size_t i = 0; i < bytes / sizeof(uint64_t); ++i)
    if (w[i] != i * kPatternMultiplier + seed) return i;
  return SIZE_MAX;
}

}  // namespace membroker::examples
