// Pool: allocations of one size class and page policy created ahead of time,
// so MallocPhysical of that size takes a ready memfd instead of creating and
// reserving memory on the request path. The broker refills a pool on its
// worker threads once takes pause (Broker::DeferBackground).
//
// Memory is never recycled from one holder to the next: a process that once
// received an allocation's fd can keep a copy of it (dup, /proc/PID/fd) and
// would read whatever the next tenant writes. So a freed allocation's pages go
// back to the kernel, and the pool gets fresh (zeroed) memory in its place.
#pragma once

#include <cstdint>
#include <deque>

#include "membroker/ipc/memfd.h"
#include "membroker/ipc/protocol.h"
#include "options.h"

namespace membroker::broker {

struct Pool {
  PoolSpec spec;
  std::deque<ipc::PhysicalMemory> ready;
  uint32_t refilling = 0;  // creations in flight on worker threads
  uint64_t hits = 0;
  uint64_t misses = 0;     // matching requests that found the pool empty
  uint64_t refills = 0;
  uint64_t refill_failures = 0;
  uint64_t in_use = 0;     // live allocations that came from this pool

  // Whether a request of this (unrounded) size, policy and flags takes from
  // here. Pooled memory is not pinned; a same-address range and an export are
  // added after the take.
  bool Matches(uint64_t size, ipc::PagePolicy policy, uint32_t flags) const {
    return !(flags & ipc::kMallocPinned) && policy == spec.policy &&
           ipc::RoundUp(size, ipc::GranularityFor(policy).minimum) == spec.size;
  }
  bool NeedsRefill() const { return ready.size() + refilling < spec.count; }
};

}  // namespace membroker::broker
