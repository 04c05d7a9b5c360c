// A channel's shared block as a process that joined it sees it (the layout
// itself is membroker/ipc/channel_layout.h, shared with the broker).
#pragma once

#include <atomic>
#include <cstdint>

#include "membroker/channel.h"
#include "membroker/ipc/channel_layout.h"

namespace membroker::detail::channel {

static_assert(kSlots == kMaxChannelSubscribers, "the layout's slots are the API's subscribers");

// The shared block as this process sees it.
struct View {
  Layout layout;
  bool broadcast = true;  // the channel's mode, read once (a sleeper's word depends on it)
  char* control = nullptr;
  char* data = nullptr;
  Header* header() const { return reinterpret_cast<Header*>(control); }
  ChunkMeta& meta(uint32_t i) const { return reinterpret_cast<ChunkMeta*>(control + layout.metas)[i]; }
  SlotHeader& slot(uint32_t s) const {
    return *reinterpret_cast<SlotHeader*>(control + layout.slots + layout.slot_stride * s);
  }
  std::atomic<uint32_t>& entry(SlotHeader& q, uint64_t position) const {
    return q.entries[position & (layout.queue_depth - 1)];
  }
  char* chunk(uint32_t i) const { return data + layout.chunk_bytes * i; }
  // The active-subscriber mask, only bits of slots that exist: a scribbled
  // bit 63 would name a slot past the block.
  uint64_t active() const { return header()->active.load() & kSlotMask; }
  // The word slot q's subscriber waits on for data.
  std::atomic<uint32_t>* data_word(SlotHeader& q, WakeMode wake) const {
    return wake == WakeMode::kFutex && broadcast ? &header()->sleepers_signal : &q.data_signal;
  }
};

}  // namespace membroker::detail::channel
