// Memfd-backed physical memory and the page-policy rules (CANN semantics).
#pragma once

#include <cstdint>
#include <string>

#include "membroker/ipc/protocol.h"
#include "membroker/ipc/unique_fd.h"
#include "membroker/status.h"

namespace membroker::ipc {

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
};

// Creates a sealed memfd of at least `size` bytes with its pages reserved
// (fallocate), so running out of memory is an error now, never a SIGBUS later.
// Sealed against shrink and grow so no holder can truncate it under the others.
Result<PhysicalMemory> CreatePhysicalMemory(const std::string& name, uint64_t size,
                                            PagePolicy policy);

// Populates and locks mem's pages in this process (pinned memory): they stay
// resident, never swapped, until mem is destroyed.
Status Pin(PhysicalMemory* mem);

// Free huge pages of a size (2 MiB or 1 GiB) on this host, from sysfs; 0 if unknown.
uint64_t FreeHugePages(uint64_t page_size);

// A read-only fd for the same memory: mmap(PROT_WRITE, MAP_SHARED) on it fails.
Result<UniqueFd> ReopenReadOnly(int fd);

// A 128-bit random token in printable form (32 lowercase hex digits).
Result<std::string> RandomToken();  // getrandom failing is an error, never a spin

}  // namespace membroker::ipc
