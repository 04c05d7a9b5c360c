// The physical-memory backend seam: everything the broker does to the memory
// it hands out - create it (sized, sealed, its pages reserved, pinned on
// request), export it as an fd (read-write, or read-only), report its
// granularity, and give it back - goes through this interface. The request
// handlers, pools, workers and the allocation table call nothing else. Two
// backends: host memory (memfds) and CUDA device memory (cuMemCreate with
// POSIX fd handles); BackendOf picks a memory's own.
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
  int device = -1;  // a CUDA device's memory (CudaBackend), or host memory
};

class PhysicalBackend {
 public:
  virtual ~PhysicalBackend() = default;
  virtual std::string_view name() const = 0;
  // MINIMUM and RECOMMENDED granularity for a policy.
  virtual ipc::Granularity Granularity(ipc::PagePolicy policy) const = 0;
  // The most bytes Create may use for this request: charged before creating.
  // 0 when the size overflows.
  virtual uint64_t MaxBytes(const MemorySpec& spec) const = 0;
  virtual Result<PhysicalMemory> Create(const MemorySpec& spec) = 0;
  // An fd to the same memory that cannot be mapped writable.
  virtual Result<ipc::UniqueFd> ReadOnlyFd(const PhysicalMemory& mem) const = 0;
  virtual void Release(PhysicalMemory mem) = 0;
};

// Host memory: sealed memfds in 4 KiB, 2 MiB or 1 GiB pages (ipc/memfd.h).
// One instance serves the whole process.
PhysicalBackend& MemfdBackend();

// CUDA device memory (cuda_backend.cc): cuMemCreate on spec.device with POSIX
// fd handles, exported as an fd that travels like a memfd. The broker keeps
// only that fd (the driver's handle is released at once): the memory lives
// while any process holds an fd, handle or mapping of it.
PhysicalBackend& CudaBackend();

// What a restart (take-over, the fd store) keeps: host memory. Device memory
// stays with the processes that hold it (their driver handles and fds), and a
// new broker does not know it (docs/MEMORY.md, "Device memory").
inline bool KeptOverRestart(const PhysicalMemory& mem) { return mem.device < 0; }

// The backend that made `mem`: host memory from `host` (the memfd backend or a
// test's), device memory from CudaBackend().
inline PhysicalBackend& BackendOf(const PhysicalMemory& mem, PhysicalBackend& host) {
  return mem.device >= 0 ? CudaBackend() : host;
}
// The backend that makes what `spec` asks for, by the same rule.
inline PhysicalBackend& BackendFor(const MemorySpec& spec, PhysicalBackend& host) {
  return spec.device >= 0 ? CudaBackend() : host;
}

}  // namespace membroker::broker
