"""KV-cache stores (docs/KV.md): a node-wide cache of fixed-size blocks found by
opaque keys (bytes, 1 to 64 of them: usually a hash chained over a prompt's
prefix), shared by every process of the host through its broker. Shaped like
the storage backends inference engines plug in: batch_exists, batch_get,
batch_set, prefix_hits.

    store = membroker.KvStore.create(client, "llama/kv", block_size=256 << 10, capacity=8 << 30)
    n = store.prefix_hits(keys)              # how many leading blocks are cached
    with store.batch_get(keys[:n]) as got:   # leases: the bytes stay until the block ends
        for block in got:                    # numpy uint8 views of the blocks, read-only
            use(block)
    store.batch_set(keys[n:], values)        # each written once; ALREADY_EXISTS is fine

Blocks are immutable once sealed: no process can write them (the kernel
refuses). A process's leases and unsealed writes end when it does, however it
ends."""
from __future__ import annotations

from typing import Iterable, Iterator, Sequence

from . import _membroker


def _keys(keys: Iterable) -> list[bytes]:
    return [k if isinstance(k, bytes) else bytes(k) if not isinstance(k, str) else k.encode() for k in keys]


class KvLeases:
    """Blocks read under leases, one per key in order: blocks[i] is a read-only
    numpy uint8 array over the block's bytes, or None where the key was not
    cached. The leases end on release() or at the end of a with block; views
    kept after that may show another key's bytes."""

    def __init__(self, native):
        self._l = native

    def __len__(self) -> int:
        return len(self._l)

    def __getitem__(self, i: int):
        return self._l.block(i)

    def __iter__(self) -> Iterator:
        return (self._l.block(i) for i in range(len(self._l)))

    @property
    def leading(self) -> int:
        """How many keys, from the first, were found."""
        return self._l.leading

    def release(self) -> None:
        self._l.release()

    def __enter__(self) -> "KvLeases":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


class KvPut:
    """Blocks reserved for writing, one per key in order. status(i) is "OK" for a
    block this process must fill (block(i): a writable numpy uint8 array of
    block_size bytes) and then seal; "ALREADY_EXISTS", "BUSY" (another process
    writes it) or "RESOURCE_EXHAUSTED" otherwise. In a with block, seal() runs
    on success and abort() on an exception."""

    def __init__(self, native):
        self._p = native

    def __len__(self) -> int:
        return len(self._p)

    def status(self, i: int) -> str:
        return self._p.status(i)

    def block(self, i: int):
        return self._p.block(i)

    def set_length(self, i: int, n: int) -> None:
        self._p.set_length(i, n)

    def seal(self) -> None:
        self._p.seal()

    def abort(self) -> None:
        self._p.abort()

    def __enter__(self) -> "KvPut":
        return self

    def __exit__(self, exc_type, *rest) -> None:
        if exc_type is None:
            self.seal()
        else:
            self.abort()


class KvStore:
    """A KV-cache store of the broker (KvStore.create or KvStore.open)."""

    def __init__(self, native):
        self._s = native

    @classmethod
    def create(cls, client, name: str, block_size: int, capacity: int, page_policy: str = "normal",
               eviction: str = "s3fifo") -> "KvStore":
        """Creates the store, or opens it if it exists with this block size."""
        return cls(_membroker.KvStore.create(client._c, name, block_size, capacity, page_policy, eviction))

    @classmethod
    def open(cls, client, name: str) -> "KvStore":
        return cls(_membroker.KvStore.open(client._c, name))

    @staticmethod
    def drop(client, name: str) -> None:
        """Removes a store that no process leases from or writes to (membroker.Busy otherwise)."""
        _membroker.KvStore.drop(client._c, name)

    block_size = property(lambda self: self._s.block_size)
    blocks = property(lambda self: self._s.blocks)

    def batch_exists(self, keys: Iterable) -> list[bool]:
        return self._s.exists(_keys(keys))

    def prefix_hits(self, keys: Iterable) -> int:
        """How many keys, from the first, are cached: a prompt's reusable prefix."""
        return self._s.prefix_hits(_keys(keys))

    def batch_get(self, keys: Iterable) -> KvLeases:
        return KvLeases(self._s.get(_keys(keys)))

    def reserve(self, keys: Iterable) -> KvPut:
        return KvPut(self._s.reserve(_keys(keys)))

    def batch_set(self, keys: Iterable, values: Sequence) -> list[bool]:
        """Stores each value (a buffer of 1 to block_size bytes: bytes, a numpy
        array, a CPU torch tensor) under its key; True where the key is cached
        now (stored, or already there)."""
        native = []
        for v in values:
            if hasattr(v, "numpy") and hasattr(v, "is_cuda"):  # a torch tensor: its bytes
                v = v.detach().contiguous().numpy()
            native.append(v)
        codes = self._s.put(_keys(keys), native)
        return [c in ("OK", "ALREADY_EXISTS") for c in codes]
