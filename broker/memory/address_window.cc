#include "memory/address_window.h"

namespace membroker::broker {

AddressWindow::AddressWindow(uint64_t base, uint64_t size) : base_(base), size_(size) {
  if (size > 0) free_[base] = size;
}

uint64_t AddressWindow::Allocate(uint64_t size, uint64_t align) {
  if (size == 0) return 0;
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    uint64_t start = it->first, len = it->second;
    uint64_t aligned = (start + align - 1) & ~(align - 1);
    if (aligned < start || aligned - start > len || len - (aligned - start) < size) continue;
    free_.erase(it);
    if (aligned > start) free_[start] = aligned - start;
    uint64_t end = aligned + size;
    if (end < start + len) free_[end] = start + len - end;
    used_[aligned] = size;
    used_bytes_ += size;
    return aligned;
  }
  return 0;
}

bool AddressWindow::Claim(uint64_t addr, uint64_t size) {
  if (size == 0 || addr + size < addr) return false;
  auto it = free_.upper_bound(addr);
  if (it == free_.begin()) return false;
  --it;
  const uint64_t start = it->first, len = it->second;
  if (addr + size > start + len) return false;
  free_.erase(it);
  if (addr > start) free_[start] = addr - start;
  if (addr + size < start + len) free_[addr + size] = start + len - (addr + size);
  used_[addr] = size;
  used_bytes_ += size;
  return true;
}

void AddressWindow::Free(uint64_t addr) {
  auto u = used_.find(addr);
  if (u == used_.end()) return;
  uint64_t start = addr, len = u->second;
  used_.erase(u);
  used_bytes_ -= len;
  // Merge with the free neighbours.
  auto next = free_.lower_bound(start);
  if (next != free_.end() && next->first == start + len) {
    len += next->second;
    next = free_.erase(next);
  }
  if (next != free_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == start) {
      start = prev->first;
      len += prev->second;
      free_.erase(prev);
    }
  }
  free_[start] = len;
}

}  // namespace membroker::broker
