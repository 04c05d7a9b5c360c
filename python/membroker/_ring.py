"""The tensor ring (docs/PIPELINE.md)."""
from __future__ import annotations

from . import _membroker


class Slot:
    """One slot of a ring: .sequence, .frame_id and .bytes (set by publish), and
    .array(dtype, shape) / .view() over its bytes in the ring's memory."""

    def __init__(self, ring: "TensorRing", raw: dict):
        self._ring, self._raw = ring, raw
        self.sequence, self.offset, self.capacity = raw["sequence"], raw["offset"], raw["capacity"]
        self.frame_id, self.bytes = raw["frame_id"], raw["bytes"]

    def view(self) -> memoryview:
        return memoryview(self._ring.mapping)[self.offset:self.offset + self.capacity]

    def array(self, dtype="uint8", shape=None):
        import numpy as np
        dt = np.dtype(dtype)
        if shape is None:
            shape = ((self.bytes or self.capacity) // dt.itemsize,)
        return np.ndarray(shape, dtype=dt, buffer=self._ring.mapping, offset=self.offset)


class TensorRing:
    """A single-producer, single-consumer ring of slots inside a mapping of
    broker memory; a stage killed mid-slot loses no frame (docs/PIPELINE.md)."""

    def __init__(self, native):
        self._r = native

    @staticmethod
    def bytes_for(slots: int, slot_bytes: int) -> int:
        return _membroker.TensorRing.bytes_for(slots, slot_bytes)

    @classmethod
    def create(cls, mapping, slots: int, slot_bytes: int) -> "TensorRing":
        return cls(_membroker.TensorRing.create(mapping, slots, slot_bytes))

    @classmethod
    def attach(cls, mapping) -> "TensorRing":
        return cls(_membroker.TensorRing.attach(mapping))

    @property
    def mapping(self):
        return self._r.mapping

    def acquire_for_write(self, timeout_ms: int = 1000) -> Slot:
        return Slot(self, self._r.acquire_for_write(timeout_ms))

    def publish(self, slot: Slot, frame_id: int, nbytes: int) -> None:
        self._r.publish(slot._raw, frame_id, nbytes)

    def acquire_for_read(self, timeout_ms: int = 1000) -> Slot:
        return Slot(self, self._r.acquire_for_read(timeout_ms))

    def release(self, slot: Slot) -> None:
        self._r.release(slot._raw)

    last_published_frame = property(lambda self: self._r.last_published_frame)
    published = property(lambda self: self._r.published)
    released = property(lambda self: self._r.released)
    slots = property(lambda self: self._r.slots)
    slot_bytes = property(lambda self: self._r.slot_bytes)
