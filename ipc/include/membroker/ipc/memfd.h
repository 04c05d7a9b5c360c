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

// Rounds size up to a multiple of align (a power of two); 0 on overflow.
uint64_t RoundUp(uint64_t size, uint64_t align);

struct PhysicalMemory {
  UniqueFd fd;
  uint64_t size = 0;       // rounded to page_size
  uint64_t page_size = 0;  // the page size actually used
  bool fell_back = false;  // HUGE_FIRST that got normal pages
};

// Creates a sealed memfd of at least `size` bytes with its pages reserved
// (fallocate), so running out of memory is an error now, never a SIGBUS later.
// Sealed against shrink and grow so no holder can truncate it under the others.
Result<PhysicalMemory> CreatePhysicalMemory(const std::string& name, uint64_t size,
                                            PagePolicy policy);

// A read-only fd for the same memory: mmap(PROT_WRITE, MAP_SHARED) on it fails.
Result<UniqueFd> ReopenReadOnly(int fd);

// A 128-bit random token in printable form (32 lowercase hex digits).
std::string RandomToken();

}  // namespace membroker::ipc
