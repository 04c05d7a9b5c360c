// Pools: allocations of one size class and page policy created ahead of time,
// so MallocPhysical of that size takes a ready memfd instead of creating and
// reserving memory on the request path. Filled before the broker reports
// ready; refilled on worker threads once takes pause (Workers).
//
// Memory is never recycled from one holder to the next: a process that once
// received an allocation's fd can keep a copy of it (dup, /proc/PID/fd) and
// would read whatever the next tenant writes. So a freed allocation's pages go
// back to the kernel, and the pool gets fresh (zeroed) memory in its place.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "memory/backend.h"
#include "memory/memfd.h"
#include "membroker/ipc/protocol.h"
#include "options.h"

namespace membroker::broker {

class Workers;

struct Pool {
  PoolSpec spec;
  std::deque<PhysicalMemory> ready;
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

class Pools {
 public:
  // name(what) is the tagged memfd name of new memory (restart/state_file.h).
  Pools(PhysicalBackend& backend, const std::vector<PoolSpec>& specs,
        std::function<std::string(const std::string&)> name);
  Pools(const Pools&) = delete;
  Pools& operator=(const Pools&) = delete;

  struct Taken {
    int pool = -1;
    PhysicalMemory memory;
  };
  // Ready memory of the pool this request matches; nullopt when none matches
  // or the match is empty (a miss).
  std::optional<Taken> Take(uint64_t size, ipc::PagePolicy policy, uint32_t flags);
  // An allocation from pool `index` was freed.
  void Returned(int index) { --pools_[static_cast<size_t>(index)].in_use; }
  void InUse(int index) { ++pools_[static_cast<size_t>(index)].in_use; }

  // Creates every pool's memory here and now (before the broker is ready).
  void Fill();
  // Queues the creation of what is missing on the workers' threads.
  void Refill(Workers& workers);
  // No refill starts after this, and refills in flight are dropped.
  void Stop() { stopping_ = true; }

  const std::deque<Pool>& all() const { return pools_; }
  // Each pool's in_use is the number of live allocations from it.
  Status Check(const std::vector<int>& live_pool_indexes) const;

 private:
  struct Refilled;
  void RefillPool(size_t index, Workers& workers);

  PhysicalBackend& backend_;
  std::function<std::string(const std::string&)> name_;
  std::deque<Pool> pools_;  // deque: a Pool is not copyable and never moves
  bool stopping_ = false;
};

}  // namespace membroker::broker
