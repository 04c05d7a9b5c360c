// libFuzzer: arbitrary bytes as a channel's control block, read the way the
// broker reads one for `membrokerctl list channels` (broker/admin/
// channel_census.h). Every subscriber can write that block, so the reader
// must hold for any bytes: no read outside the block, and what it accepts
// keeps to the geometry it checked.
// Input: a 4-byte little-endian size the block claims, then its first bytes
// (the rest of a 64 KiB block is zero, as fresh broker memory is).
#include <cstdint>
#include <cstdlib>
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "admin/channel_census.h"
#include "membroker/ipc/channel_layout.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  constexpr size_t kBlock = 64 << 10;
  if (size < 4) return 0;
  uint32_t claimed = 0;
  std::memcpy(&claimed, data, 4);
  const size_t bytes = claimed % (kBlock + 1);
  // Exactly `bytes` long, so AddressSanitizer sees any read past the block;
  // aligned as the broker's mapping is.
  struct AlignedDelete {
    void operator()(char* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<char[], AlignedDelete> block(new (std::align_val_t{64}) char[bytes == 0 ? 1 : bytes]());
  std::memcpy(block.get(), data + 4, std::min(size - 4, bytes));
  const auto c = membroker::broker::ReadChannel(block.get(), bytes);
  if (!c.ok()) {
    if (c.status().message().empty()) std::abort();  // a refusal says why
    return 0;
  }
  if (c->queue_depth == 0 || c->fullest_queue > c->queue_depth || c->chunks_in_use > c->chunks ||
      c->subscribers > membroker::detail::channel::kSlots || c->queued > uint64_t{c->subscribers} * c->queue_depth)
    std::abort();
  return 0;
}
