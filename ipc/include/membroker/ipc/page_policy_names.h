// Page policies by name: the one list that --pool, the config file, the
// admin `config` command and the Python package read and write. Header-only
// (no symbol of libmembroker), so the Python module uses it as it is.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>

#include "membroker/ipc/protocol.h"

namespace membroker::ipc {

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
