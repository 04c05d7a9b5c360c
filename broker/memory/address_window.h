// AddressWindow: hands out virtual address ranges for same-address
// allocations (CANN's VA consistency), so every process maps such an
// allocation at one address and raw pointers inside it stay valid everywhere.
// The broker reserves nothing itself: each client checks the range is free in
// its own address space when it maps.
#pragma once

#include <cstdint>
#include <map>

namespace membroker::broker {

class AddressWindow {
 public:
  AddressWindow(uint64_t base, uint64_t size);

  // A free range of `size` bytes aligned to `align` (a power of two), first
  // fit; 0 when the window has no such range.
  uint64_t Allocate(uint64_t size, uint64_t align);
  // Takes exactly [addr, addr+size) if it is free: a same-address allocation
  // a reattaching client presents keeps its address. False otherwise.
  bool Claim(uint64_t addr, uint64_t size);
  // Returns a range from Allocate or Claim to the window; unknown addresses are ignored.
  void Free(uint64_t addr);

  uint64_t base() const { return base_; }
  uint64_t size() const { return size_; }
  uint64_t used() const { return used_bytes_; }

 private:
  uint64_t base_, size_;
  uint64_t used_bytes_ = 0;
  std::map<uint64_t, uint64_t> free_;  // start -> length
  std::map<uint64_t, uint64_t> used_;  // start -> length
};

}  // namespace membroker::broker
