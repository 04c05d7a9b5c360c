// The tensor ring in the C API (membroker/membroker.h) over membroker/tensor_ring.h.
#include "c_api/c_api_internal.h"
#include "membroker/membroker.h"
#include "membroker/tensor_ring.h"

using namespace membroker;
using membroker::c_api::Done;
using membroker::c_api::Fail;
using membroker::c_api::Guard;

struct mb_tensor_ring {
  TensorRing ring;
};

namespace {

mb_ring_slot ToC(const TensorRing::Slot& s) { return {s.sequence, s.data, s.capacity, s.frame_id, s.bytes}; }
TensorRing::Slot FromC(const mb_ring_slot& s) { return {s.sequence, s.data, s.capacity, s.frame_id, s.bytes}; }

int Wrap(Result<TensorRing> r, mb_tensor_ring** out) {
  if (!r.ok()) return Fail(r.status());
  *out = new mb_tensor_ring{std::move(*r)};
  return MB_OK;
}

}  // namespace

extern "C" {

size_t mb_tensor_ring_bytes_for(uint32_t slots, size_t slot_bytes) { return TensorRing::BytesFor(slots, slot_bytes); }

int mb_tensor_ring_create(void* base, size_t size, uint32_t slots, size_t slot_bytes, mb_tensor_ring** out) {
  return Guard([&]() -> int {
    MB_NEED(out != nullptr, "out must not be NULL");
    return Wrap(TensorRing::Create(base, size, slots, slot_bytes), out);
  });
}

int mb_tensor_ring_attach(void* base, size_t size, mb_tensor_ring** out) {
  return Guard([&]() -> int {
    MB_NEED(out != nullptr, "out must not be NULL");
    return Wrap(TensorRing::Attach(base, size), out);
  });
}

void mb_tensor_ring_free(mb_tensor_ring* ring) { delete ring; }

int mb_tensor_ring_acquire_for_write(mb_tensor_ring* ring, int timeout_ms, mb_ring_slot* out) {
  return Guard([&]() -> int {
    MB_NEED(ring && out, "ring and out must not be NULL");
    auto s = ring->ring.AcquireForWrite(timeout_ms);
    if (!s.ok()) return Fail(s.status());
    *out = ToC(*s);
    return MB_OK;
  });
}

int mb_tensor_ring_publish(mb_tensor_ring* ring, const mb_ring_slot* slot, uint64_t frame_id, size_t bytes) {
  return Guard([&]() -> int {
    MB_NEED(ring && slot, "ring and slot must not be NULL");
    return Done(ring->ring.Publish(FromC(*slot), frame_id, bytes));
  });
}

int mb_tensor_ring_acquire_for_read(mb_tensor_ring* ring, int timeout_ms, mb_ring_slot* out) {
  return Guard([&]() -> int {
    MB_NEED(ring && out, "ring and out must not be NULL");
    auto s = ring->ring.AcquireForRead(timeout_ms);
    if (!s.ok()) return Fail(s.status());
    *out = ToC(*s);
    return MB_OK;
  });
}

int mb_tensor_ring_release(mb_tensor_ring* ring, const mb_ring_slot* slot) {
  return Guard([&]() -> int {
    MB_NEED(ring && slot, "ring and slot must not be NULL");
    return Done(ring->ring.Release(FromC(*slot)));
  });
}

uint64_t mb_tensor_ring_last_published_frame(const mb_tensor_ring* ring) {
  return ring == nullptr ? 0 : ring->ring.last_published_frame();
}

}  // extern "C"
