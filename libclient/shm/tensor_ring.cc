#include "membroker/tensor_ring.h"

#include <atomic>
#include <chrono>

#include "shm/futex.h"

namespace membroker {

namespace {
constexpr uint64_t kMagic = 0x4d4252494e47ull;  // "MBRING"
constexpr size_t kAlign = 64;

size_t AlignUp(size_t v) { return (v + kAlign - 1) / kAlign * kAlign; }

struct SlotMeta {
  uint64_t frame_id;
  uint64_t bytes;
};

void WaitUntil(std::atomic<uint32_t>* word, uint32_t seen, std::chrono::steady_clock::time_point deadline) {
  detail::FutexWait(word, seen, deadline - std::chrono::steady_clock::now());
}
}  // namespace

struct TensorRing::Header {
  uint64_t magic;
  uint32_t slots;
  uint32_t pad;
  uint64_t slot_bytes;
  uint64_t data_offset;
  alignas(64) std::atomic<uint64_t> head;  // slots published
  std::atomic<uint64_t> last_frame;
  std::atomic<uint32_t> head_seq;          // futex word: bumped on every publish
  alignas(64) std::atomic<uint64_t> tail;  // slots released
  std::atomic<uint32_t> tail_seq;          // futex word: bumped on every release
  alignas(64) SlotMeta meta[1];            // `slots` entries
};

size_t TensorRing::DataOffset(uint32_t slots) {
  return AlignUp(offsetof(Header, meta) + sizeof(SlotMeta) * slots);
}

size_t TensorRing::BytesFor(uint32_t slots, size_t slot_bytes) {
  // Saturates instead of wrapping: a size no region has.
  const size_t aligned = AlignUp(slot_bytes);
  if (aligned < slot_bytes || (slots != 0 && aligned > (SIZE_MAX - DataOffset(slots)) / slots))
    return SIZE_MAX;
  return DataOffset(slots) + aligned * slots;
}

Result<TensorRing> TensorRing::Create(void* base, size_t size, uint32_t slots, size_t slot_bytes) {
  if (base == nullptr || slots == 0 || slot_bytes == 0 || BytesFor(slots, slot_bytes) > size)
    return Status(ErrorCode::kParamInvalid, "the ring needs " + std::to_string(BytesFor(slots, slot_bytes)) +
                                                " bytes; the region has " + std::to_string(size));
  auto* h = static_cast<Header*>(base);
  h->slots = slots;
  h->slot_bytes = AlignUp(slot_bytes);
  h->data_offset = DataOffset(slots);
  h->head.store(0);
  h->tail.store(0);
  h->last_frame.store(0);
  h->head_seq.store(0);
  h->tail_seq.store(0);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  h->magic = kMagic;  // last: Attach refuses a half-made ring
  return TensorRing(h, static_cast<char*>(base) + h->data_offset, slots, h->slot_bytes);
}

Result<TensorRing> TensorRing::Attach(void* base, size_t size) {
  // Another process wrote this header: nothing in it is trusted until it is
  // checked, and the geometry is copied out once, so a later scribble on the
  // header cannot move a slot outside the region.
  auto* h = static_cast<Header*>(base);
  if (base == nullptr || size < sizeof(Header) || h->magic != kMagic)
    return Status(ErrorCode::kParamInvalid, "no tensor ring at this address (or the region is too small)");
  const uint32_t slots = h->slots;
  const uint64_t slot_bytes = h->slot_bytes;
  if (slots == 0 || slot_bytes == 0 || slot_bytes % kAlign != 0 || h->data_offset != DataOffset(slots) ||
      BytesFor(slots, slot_bytes) > size)
    return Status(ErrorCode::kProtocolError,
                  "the tensor ring's header is corrupt: " + std::to_string(slots) + " slots of " +
                      std::to_string(slot_bytes) + " bytes at offset " + std::to_string(h->data_offset) +
                      " do not fit a region of " + std::to_string(size) + " bytes");
  const uint64_t head = h->head.load(), tail = h->tail.load();
  if (tail > head || head - tail > slots)
    return Status(ErrorCode::kProtocolError, "the tensor ring's positions are corrupt (published " +
                                                 std::to_string(head) + ", released " +
                                                 std::to_string(tail) + ")");
  return TensorRing(h, static_cast<char*>(base) + DataOffset(slots), slots, slot_bytes);
}

Result<TensorRing::Slot> TensorRing::AcquireForWrite(int timeout_ms) {
  if (h_ == nullptr) return Status(ErrorCode::kParamInvalid, "ring not attached");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    uint32_t seen = h_->tail_seq.load();
    uint64_t head = h_->head.load();
    uint64_t tail = h_->tail.load();
    if (tail > head || head - tail > slots_) return Corrupt(head, tail);
    if (head - tail < slots_) {
      size_t i = head % slots_;
      return Slot{head, data_ + i * slot_bytes_, slot_bytes_, 0, 0};
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return Status(ErrorCode::kTimeout, "the ring stayed full (is its consumer alive?)");
    WaitUntil(&h_->tail_seq, seen, deadline);
  }
}

Status TensorRing::Publish(const Slot& slot, uint64_t frame_id, size_t bytes) {
  if (h_ == nullptr || slot.sequence != h_->head.load() || bytes > slot_bytes_)
    return Status(ErrorCode::kParamInvalid, "not the slot AcquireForWrite returned, or too many bytes");
  h_->meta[slot.sequence % slots_] = SlotMeta{frame_id, bytes};
  h_->last_frame.store(frame_id);
  h_->head.store(slot.sequence + 1);  // release: the slot's bytes and meta are visible first
  h_->head_seq.fetch_add(1);
  detail::FutexWakeAll(&h_->head_seq);
  return Status::Ok();
}

Result<TensorRing::Slot> TensorRing::AcquireForRead(int timeout_ms) {
  if (h_ == nullptr) return Status(ErrorCode::kParamInvalid, "ring not attached");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    uint32_t seen = h_->head_seq.load();
    uint64_t tail = h_->tail.load();
    uint64_t head = h_->head.load();
    if (tail > head || head - tail > slots_) return Corrupt(head, tail);
    if (tail < head) {
      size_t i = tail % slots_;
      const SlotMeta m = h_->meta[i];  // copied: the producer's process wrote it
      if (m.bytes > slot_bytes_)
        return Status(ErrorCode::kProtocolError, "slot " + std::to_string(tail) + " claims " +
                                                     std::to_string(m.bytes) + " bytes in a slot of " +
                                                     std::to_string(slot_bytes_));
      return Slot{tail, data_ + i * slot_bytes_, slot_bytes_, m.frame_id, m.bytes};
    }
    if (std::chrono::steady_clock::now() >= deadline)
      return Status(ErrorCode::kTimeout, "nothing was published in time (is the producer alive?)");
    WaitUntil(&h_->head_seq, seen, deadline);
  }
}

Status TensorRing::Release(const Slot& slot) {
  if (h_ == nullptr || slot.sequence != h_->tail.load())
    return Status(ErrorCode::kParamInvalid, "not the slot AcquireForRead returned");
  h_->tail.store(slot.sequence + 1);
  h_->tail_seq.fetch_add(1);
  detail::FutexWakeAll(&h_->tail_seq);
  return Status::Ok();
}

uint64_t TensorRing::last_published_frame() const { return h_ ? h_->last_frame.load() : 0; }
uint64_t TensorRing::published() const { return h_ ? h_->head.load() : 0; }
uint64_t TensorRing::released() const { return h_ ? h_->tail.load() : 0; }
uint32_t TensorRing::slots() const { return slots_; }
size_t TensorRing::slot_bytes() const { return slot_bytes_; }

Status TensorRing::Corrupt(uint64_t head, uint64_t tail) {
  return Status(ErrorCode::kProtocolError, "the tensor ring's positions are corrupt (published " +
                                               std::to_string(head) + ", released " + std::to_string(tail) + ")");
}

}  // namespace membroker
