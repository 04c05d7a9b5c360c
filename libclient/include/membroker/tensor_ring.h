// A single-producer, single-consumer ring of tensor slots inside shared memory
// (a mapped broker allocation): stages of a pipeline hand tensors over without
// copying - the producer writes into a slot, the consumer reads it in place.
// Lock-free (atomics only); a side that has to wait sleeps on a futex.
//
// A stage that dies does not wedge the ring. A consumer's slot is released
// only by Release(), so if it dies while holding one, the slot is still the
// oldest unreleased slot: the stage that replaces it gets the same slot (same
// frame) back from AcquireForRead. A producer that dies before Publish() has
// published nothing: its replacement acquires the same slot again.
// last_published_frame() tells a restarted stage which frames it already
// produced, so work is done once.
#pragma once

#include <cstddef>
#include <cstdint>

#include "membroker/status.h"

namespace membroker {

class MEMBROKER_API TensorRing {
 public:
  struct Slot {
    uint64_t sequence = 0;  // position in the ring's history (0, 1, 2, ...)
    void* data = nullptr;
    size_t capacity = 0;
    uint64_t frame_id = 0;  // set by Publish
    size_t bytes = 0;       // set by Publish
  };

  // Bytes a ring of `slots` slots of slot_bytes each needs (slots are 64-byte aligned).
  static size_t BytesFor(uint32_t slots, size_t slot_bytes);
  // Formats [base, base+size) as an empty ring.
  static Result<TensorRing> Create(void* base, size_t size, uint32_t slots, size_t slot_bytes);
  // Attaches to a ring another process created (any address). The header is
  // validated (PROTOCOL_ERROR when its geometry does not fit the region or its
  // positions are impossible), and every later read of what the other side
  // wrote is bounds-checked.
  static Result<TensorRing> Attach(void* base, size_t size);

  TensorRing() = default;

  // Producer: the next free slot; waits up to timeout_ms while the ring is full (TIMEOUT).
  Result<Slot> AcquireForWrite(int timeout_ms);
  // Producer: hands the slot to the consumer.
  Status Publish(const Slot& slot, uint64_t frame_id, size_t bytes);
  // Consumer: the oldest published slot; waits up to timeout_ms while empty (TIMEOUT).
  Result<Slot> AcquireForRead(int timeout_ms);
  // Consumer: gives the slot back to the producer.
  Status Release(const Slot& slot);

  uint64_t last_published_frame() const;  // 0: nothing published yet
  uint64_t published() const;             // slots published so far
  uint64_t released() const;              // slots released so far
  uint32_t slots() const;
  size_t slot_bytes() const;

 private:
  // The layout in shared memory (tensor_ring.cc).
  struct Header;
  static size_t DataOffset(uint32_t slots);  // where the slots start
  TensorRing(Header* h, char* data, uint32_t slots, size_t slot_bytes)
      : h_(h), data_(data), slots_(slots), slot_bytes_(slot_bytes) {}
  static Status Corrupt(uint64_t head, uint64_t tail);
  Header* h_ = nullptr;
  char* data_ = nullptr;
  // Checked at Attach and kept here: the header's copies are never trusted again.
  uint32_t slots_ = 0;
  size_t slot_bytes_ = 0;
};

}  // namespace membroker
