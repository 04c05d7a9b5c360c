// The memory the broker may really use: the host's RAM, or less where a
// memory cgroup (v2 memory.max / memory.high, v1 memory.limit_in_bytes, on
// the broker's own cgroup and every ancestor) says so; and the memory it may
// lock (RLIMIT_MEMLOCK, unless it may lock without limit). The default
// budgets come from these, so a request over the budget is an error reply,
// never the kernel's OOM killer ending the broker and everything it holds.
#pragma once

#include <cstdint>
#include <string>

#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

struct MemoryCeiling {
  uint64_t bytes = 0;
  std::string source;  // where the figure comes from, for stats and config
  // Where a cgroup limit is the ceiling: the file with that cgroup's usage
  // (v2 memory.current, v1 memory.usage_in_bytes); empty for RAM.
  std::string usage_file;
};

// The smallest of RAM and every memory limit of the cgroups this process is in.
MemoryCeiling MemoryAvailable();

// What the cgroup a ceiling comes from has left, its usage file kept open
// (one pread per check).
class CgroupHeadroom {
 public:
  explicit CgroupHeadroom(MemoryCeiling ceiling);
  // OK, or RESOURCE_EXHAUSTED saying so when `bytes` more would pass the
  // cgroup's limit (its usage read now): the kernel would refuse those pages,
  // or its OOM killer end the broker and everything it holds. Always OK where
  // no cgroup limits the broker.
  Status Check(uint64_t bytes) const;

 private:
  MemoryCeiling ceiling_;
  ipc::UniqueFd usage_;
};

// RLIMIT_MEMLOCK, or RAM when the process may lock without limit (root,
// CAP_IPC_LOCK, or an unlimited rlimit).
MemoryCeiling LockableMemory();

}  // namespace membroker::broker
