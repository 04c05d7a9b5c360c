// The memory the broker may really use: the host's RAM, or less where a
// memory cgroup (v2 memory.max / memory.high, v1 memory.limit_in_bytes, on
// the broker's own cgroup and every ancestor) says so; and the memory it may
// lock (RLIMIT_MEMLOCK, unless it may lock without limit). The default
// budgets come from these, so a request over the budget is an error reply,
// never the kernel's OOM killer ending the broker and everything it holds.
#pragma once

#include <cstdint>
#include <string>

namespace membroker::broker {

struct MemoryCeiling {
  uint64_t bytes = 0;
  std::string source;  // where the figure comes from, for stats and config
};

// The smallest of RAM and every memory limit of the cgroups this process is in.
MemoryCeiling MemoryAvailable();

// RLIMIT_MEMLOCK, or RAM when the process may lock without limit (root,
// CAP_IPC_LOCK, or an unlimited rlimit).
MemoryCeiling LockableMemory();

}  // namespace membroker::broker
