#include "membroker/ipc/page_policy.h"

namespace membroker::ipc {

Granularity GranularityFor(PagePolicy policy) {
  switch (policy) {
    case PagePolicy::kNormalOnly:
      return {policy, kNormalPageSize, kHuge2MPageSize};
    case PagePolicy::kHugeFirst:
      return {policy, kNormalPageSize, kHuge2MPageSize};
    case PagePolicy::kHugeOnly:
      return {policy, kHuge2MPageSize, kHuge2MPageSize};
    case PagePolicy::kHuge1GOnly:
      return {policy, kHuge1GPageSize, kHuge1GPageSize};
  }
  return {policy, kNormalPageSize, kHuge2MPageSize};
}

uint64_t RoundUp(uint64_t size, uint64_t align) {
  uint64_t r = (size + align - 1) & ~(align - 1);
  return r < size ? 0 : r;
}

uint64_t PreferredPageSize(PagePolicy policy, uint64_t size) {
  if (policy == PagePolicy::kHugeFirst)
    return size <= kHugeFirstThreshold ? kNormalPageSize : kHuge2MPageSize;
  return GranularityFor(policy).minimum;
}

}  // namespace membroker::ipc
