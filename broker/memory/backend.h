// The physical-memory backend seam: everything the broker does to the memory
// it hands out - create it (sized, sealed, its pages reserved, pinned on
// request), export it as an fd (read-write, or read-only), report its
// granularity, and give it back - goes through this interface. The request
// handlers, pools, workers and the allocation table call nothing else, so a
// second backend (CUDA VMM device memory, cuMemCreate with POSIX fd handles)
// plugs in here without touching them.
//
// Lifetime rules:
//  1. Create returns a whole PhysicalMemory or an error; nothing half made
//     stays behind.
//  2. The memory lives while its PhysicalMemory does; Release gives it back
//     (for memfds: the last fd and the pin close, and the kernel frees the
//     pages once no process maps them).
//  3. Create and Release may run on worker threads: a backend is thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "memory/memfd.h"
#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

struct MemorySpec {
  std::string name;  // shown in /proc/PID/fd and /proc/PID/maps
  uint64_t size = 0;
  ipc::PagePolicy policy = ipc::PagePolicy::kNormalOnly;
  bool pinned = false;
};

class PhysicalBackend {
 public:
  virtual ~PhysicalBackend() = default;
  virtual std::string_view name() const = 0;
  // MINIMUM and RECOMMENDED granularity for a policy.
  virtual ipc::Granularity Granularity(ipc::PagePolicy policy) const = 0;
  // The most bytes Create may use for this request: charged before creating.
  // 0 when the size overflows.
  virtual uint64_t MaxBytes(uint64_t size, ipc::PagePolicy policy) const = 0;
  virtual Result<PhysicalMemory> Create(const MemorySpec& spec) = 0;
  // An fd to the same memory that cannot be mapped writable.
  virtual Result<ipc::UniqueFd> ReadOnlyFd(const PhysicalMemory& mem) const = 0;
  virtual void Release(PhysicalMemory mem) = 0;
};

// Host memory: sealed memfds in 4 KiB, 2 MiB or 1 GiB pages (ipc/memfd.h).
// One instance serves the whole process.
PhysicalBackend& MemfdBackend();

}  // namespace membroker::broker
