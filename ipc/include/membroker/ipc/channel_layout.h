// A channel's shared layout (membroker/channel.h; libclient/shm/channel.cc
// uses it, and the broker reads it for `list channels`), as the engine's
// control block has ipc/engine_control.h. The control block, shared writable
// by the publisher and every subscriber:
//
//   Header       geometry (checked once at Join and kept locally), the
//                publisher's pid, the active-subscriber mask, futex words
//                (one that every sleeping subscriber of a broadcast channel
//                waits on, so one system call wakes them all), and the
//                publisher's counters, copied there for operators
//   ChunkMeta[N] per chunk: `waiting`, one bit per subscriber slot the chunk
//                is queued to or held by, plus kLoaned while the publisher
//                has it; size and sequence of its last publication
//   Slot[63]     per subscriber: state, pid, and a queue of chunk indices
//                (head: taken, by CAS - the subscriber taking, or the
//                publisher dropping the oldest; tail: pushed by the publisher)
//
// A chunk is free when `waiting` is 0. Each release clears one bit, so
// whoever cleans up after a dead subscriber clears that subscriber's bit on
// every chunk and gets back exactly what it held, wherever it died.
//
// Nothing read from it is trusted before it is checked: the geometry is
// checked once at Join and kept locally; positions come from Layout, computed
// from the geometry alone.
#pragma once

#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

namespace membroker::detail::channel {

inline constexpr uint64_t kMagic = 0x4d424348414e4e34ull;  // "MBCHANN4": layout 4 (counters in the header)
inline constexpr uint32_t kSlots = 63;                     // kMaxChannelSubscribers (membroker/channel.h)
inline constexpr uint64_t kLoaned = uint64_t{1} << 63;
inline constexpr size_t kLine = 64;
inline constexpr uint32_t kMaxChunks = 65536;
inline constexpr uint32_t kMaxQueueDepth = 4096;
inline constexpr uint64_t kSlotMask = (uint64_t{1} << kSlots) - 1;
enum SlotState : uint32_t { kFree = 0, kJoining = 1, kActive = 2, kLeaving = 3 };

inline size_t AlignUp(size_t v) { return (v + kLine - 1) / kLine * kLine; }

struct Header {
  std::atomic<uint64_t> magic;  // stored last by the publisher
  uint32_t chunks;
  uint32_t queue_depth;
  uint64_t chunk_bytes;
  uint32_t mode;
  uint32_t when_full;
  int32_t publisher_pid;
  alignas(kLine) std::atomic<uint64_t> active;  // bit s: slot s receives
  std::atomic<uint32_t> closed;                 // the publisher has gone
  std::atomic<uint32_t> free_signal;            // futex: bumped when a chunk frees while the publisher waits
  std::atomic<uint32_t> publisher_waiting;
  std::atomic<uint64_t> publishing;             // odd while a Publish is under way
  // futex: a broadcast channel's sleeping subscribers all wait here (those
  // that poll watch their own slot's data_signal).
  alignas(kLine) std::atomic<uint32_t> sleepers_signal;
  // The publisher's counts (ChannelStats), stored by it after each change;
  // others only read them, and only as figures to show.
  alignas(kLine) std::atomic<uint64_t> published;
  std::atomic<uint64_t> dropped;
  std::atomic<uint64_t> unreceived;
  std::atomic<uint64_t> reaped;
  std::atomic<uint64_t> reclaimed;
  std::atomic<uint64_t> redelivered;
};

struct ChunkMeta {
  std::atomic<uint64_t> waiting;
  uint64_t size;
  uint64_t sequence;
  uint64_t pad;
};

struct SlotHeader {
  std::atomic<uint32_t> state;
  std::atomic<int32_t> pid;
  std::atomic<uint32_t> generation;
  std::atomic<uint64_t> wake_nonce;  // its wake fd's address (channel_wake.h); 0: none
  alignas(kLine) std::atomic<uint64_t> head;
  std::atomic<uint32_t> space_signal;  // futex: bumped on a take while the publisher waits for room
  std::atomic<uint32_t> publisher_waiting;
  alignas(kLine) std::atomic<uint64_t> tail;
  std::atomic<uint32_t> data_signal;  // futex: bumped on a push while the subscriber waits
  std::atomic<uint32_t> subscriber_waiting;
  alignas(kLine) std::atomic<uint32_t> entries[1];  // queue_depth of them
};

// A queue's head and tail as they were at one moment, or false (read again).
// The other side moves the head (a take, or a drop of the oldest) and the
// publisher the tail: a head read before the tail may be several pushes and
// drops old, and such a pair once looked like a queue holding more than its
// depth. The head is read again after the tail; unchanged, the pair held when
// the tail was read.
inline bool QueueSnapshot(const SlotHeader& q, uint64_t* head, uint64_t* tail) {
  const uint64_t h = q.head.load();
  const uint64_t t = q.tail.load();
  if (q.head.load() != h) return false;
  *head = h;
  *tail = t;
  return true;
}

// Where everything is, computed from the geometry alone (never read from
// the shared block).
struct Layout {
  uint32_t chunks = 0, queue_depth = 0;
  size_t chunk_bytes = 0;
  size_t metas = 0, slots = 0, slot_stride = 0, control_bytes = 0, data_bytes = 0;

  static Layout For(uint32_t chunks, size_t chunk_bytes, uint32_t queue_depth) {
    Layout l;
    l.chunks = chunks;
    l.queue_depth = queue_depth;
    l.chunk_bytes = AlignUp(chunk_bytes);
    l.metas = AlignUp(sizeof(Header));
    l.slots = AlignUp(l.metas + sizeof(ChunkMeta) * chunks);
    l.slot_stride = AlignUp(offsetof(SlotHeader, entries) + sizeof(uint32_t) * queue_depth);
    l.control_bytes = l.slots + l.slot_stride * kSlots;
    l.data_bytes = l.chunk_bytes * chunks;
    return l;
  }
};

inline bool Valid(uint32_t chunks, size_t chunk_bytes, uint32_t queue_depth) {
  return chunks >= 1 && chunks <= kMaxChunks && chunk_bytes >= 1 && chunk_bytes <= (size_t{1} << 40) &&
         queue_depth >= 1 && queue_depth <= kMaxQueueDepth && std::has_single_bit(queue_depth);
}

}  // namespace membroker::detail::channel
