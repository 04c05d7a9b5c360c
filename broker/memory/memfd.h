// Memfd-backed physical memory, as the broker creates it: sealed, sized, its
// pages reserved, pinned on request (MemfdBackend is the backend over it).
// Broker-only: the client library never creates memory.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "membroker/ipc/page_policy.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::broker {

using ipc::PagePolicy;
using ipc::UniqueFd;

// A mapping of memory locked in RAM (mlock) for as long as it lives.
class LockedMapping {
 public:
  LockedMapping() = default;
  LockedMapping(void* addr, uint64_t size) : addr_(addr), size_(size) {}
  LockedMapping(LockedMapping&& o) noexcept { *this = std::move(o); }
  LockedMapping& operator=(LockedMapping&& o) noexcept;
  ~LockedMapping();
  bool locked() const { return addr_ != nullptr; }

 private:
  void* addr_ = nullptr;
  uint64_t size_ = 0;
};

struct PhysicalMemory {
  UniqueFd fd;
  uint64_t size = 0;       // rounded to page_size
  uint64_t page_size = 0;  // the page size actually used
  bool fell_back = false;  // HUGE_FIRST that got normal pages
  LockedMapping lock;      // set for pinned memory
  int device = -1;         // CUDA device memory (its fd is the driver's), or -1
};

// memfd_create(name, flags), with args naming what it is for in an error.
// Under ThreadSanitizer the file is opened again through /proc and the first
// fd closed unseen: TSan does not see memfd_create (nor libuv's closes, raw
// system calls), so on a worker it would take a reused fd number for the
// socket the loop thread last had there and report a race between the two.
Result<UniqueFd> CreateMemfd(const std::string& name, unsigned flags, const std::string& args);

// Creates a sealed memfd of at least `size` bytes with its pages reserved
// (fallocate), so running out of memory is an error now, never a SIGBUS later.
// Sealed against shrink and grow so no holder can truncate it under the others.
// With `writable`, memory only the broker writes (a KV store's slab): it is
// mapped read-write at *writable, then sealed with F_SEAL_FUTURE_WRITE, so no
// fd of it - a copy, or one reopened read-write through /proc - can write it
// or map it writable; the caller munmaps *writable. `fill`, if given, is
// called with the fd after the pages are reserved and before the seals (a
// write(2) through the fd is the one way to fill pages that tmpfs does not
// clear first: docs/KV.md, "Across a restart").
Result<PhysicalMemory> CreatePhysicalMemory(const std::string& name, uint64_t size, PagePolicy policy,
                                            void** writable = nullptr,
                                            const std::function<Status(int fd)>& fill = nullptr);

// Populates and locks mem's pages in this process (pinned memory): they stay
// resident, never swapped, until mem is destroyed.
Status Pin(PhysicalMemory* mem);

// Free huge pages of a size (2 MiB or 1 GiB) on this host, from sysfs; 0 if unknown.
uint64_t FreeHugePages(uint64_t page_size);

// A read-only fd for the same memory: mmap(PROT_WRITE, MAP_SHARED) on it fails.
Result<UniqueFd> ReopenReadOnly(int fd);

}  // namespace membroker::broker
