// Page policies (CANN semantics): the page sizes, each policy's granularity
// and its name. What both sides need; creating memory is the broker's
// (broker/memory/memfd.h). The names are the one list that --pool, the config
// file, the admin `config` command and the Python package read and write.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace membroker::ipc {

enum class PagePolicy : uint8_t { kNormalOnly = 0, kHugeFirst = 1, kHugeOnly = 2, kHuge1GOnly = 3 };

struct Granularity {
  PagePolicy policy = PagePolicy::kNormalOnly;
  uint64_t minimum = 0;
  uint64_t recommended = 0;
  bool operator==(const Granularity&) const = default;
};

inline constexpr uint64_t kNormalPageSize = 4096;
inline constexpr uint64_t kHuge2MPageSize = 2ull << 20;
inline constexpr uint64_t kHuge1GPageSize = 1ull << 30;
// HUGE_FIRST gives requests up to this size normal pages.
inline constexpr uint64_t kHugeFirstThreshold = 1ull << 20;
// The largest single allocation the protocol accepts (the broker's byte budget
// is usually the tighter limit).
inline constexpr uint64_t kMaxAllocationBytes = 1ull << 40;

// MINIMUM and RECOMMENDED granularity for a policy. For HUGE_FIRST the minimum
// is the normal page (small requests get normal pages).
Granularity GranularityFor(PagePolicy policy);

// The page size a policy asks for first for a request of `size` bytes
// (HUGE_FIRST may then fall back to normal pages).
uint64_t PreferredPageSize(PagePolicy policy, uint64_t size);

// Rounds size up to a multiple of align (a power of two); 0 on overflow.
uint64_t RoundUp(uint64_t size, uint64_t align);

inline constexpr std::pair<std::string_view, PagePolicy> kPagePolicyNames[] = {
    {"normal", PagePolicy::kNormalOnly},
    {"huge-first", PagePolicy::kHugeFirst},
    {"huge", PagePolicy::kHugeOnly},
    {"huge1g", PagePolicy::kHuge1GOnly},
};
static_assert(std::size(kPagePolicyNames) == static_cast<size_t>(PagePolicy::kHuge1GOnly) + 1);

inline std::optional<PagePolicy> PagePolicyFromName(std::string_view name) {
  for (const auto& [n, p] : kPagePolicyNames)
    if (n == name) return p;
  return std::nullopt;
}

inline std::string_view PagePolicyName(PagePolicy policy) {
  for (const auto& [n, p] : kPagePolicyNames)
    if (p == policy) return n;
  return "unknown";
}

// "normal, huge-first, huge, huge1g", for error messages.
inline std::string PagePolicyNameList() {
  std::string out;
  for (const auto& [n, p] : kPagePolicyNames) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace membroker::ipc
