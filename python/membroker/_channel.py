"""Channels (docs/PIPELINE.md): zero-copy publish/subscribe over a pool of chunks
in broker memory that every side maps once. A chunk is a buffer (memoryview,
numpy, torch.frombuffer) valid until it is published (publisher) or released
(subscriber); after that its buffer is empty."""
from __future__ import annotations

import asyncio

from . import _errors, _membroker


class Chunk:
    """A loaned (writable) or received (read-only) chunk: .size, .capacity,
    .sequence, .index, and .numpy(dtype, shape) / .torch(dtype, shape) over its
    bytes."""

    def __init__(self, native):
        self._c = native

    def __buffer__(self, flags):  # Python 3.12+; older ones use memoryview(chunk.native)
        return memoryview(self._c)

    @property
    def native(self):
        return self._c

    size = property(lambda self: self._c.size, lambda self, n: setattr(self._c, "size", n))
    capacity = property(lambda self: self._c.capacity)
    sequence = property(lambda self: self._c.sequence)
    index = property(lambda self: self._c.index)

    def view(self) -> memoryview:
        return memoryview(self._c)

    def numpy(self, dtype="uint8", shape=None):
        """A numpy array over the chunk, no copy: read-only for a received chunk;
        its whole capacity for a loaned one, its published size for a received one."""
        import numpy as np
        dt = np.dtype(dtype)
        a = np.frombuffer(memoryview(self._c), dtype=dt, count=len(memoryview(self._c)) // dt.itemsize)
        return a.reshape(shape) if shape is not None else a

    def torch(self, dtype=None, shape=None):
        """A torch tensor over the chunk, no copy (torch.from_numpy of .numpy()).
        dtype: a torch dtype, or what numpy takes; uint8 by default. torch has
        no read-only tensors: a write through a received chunk's tensor is a
        SIGSEGV (its pages are mapped read-only), so do not write it."""
        import torch
        import warnings
        np_dtype = "uint8"
        if dtype is not None:
            np_dtype = torch.empty((), dtype=dtype).numpy().dtype if isinstance(dtype, torch.dtype) else dtype
        arr = self.numpy(np_dtype, shape)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about non-writeable arrays
            return torch.from_numpy(arr)


class ChannelPublisher:
    """Creates a channel under `name`. mode: "broadcast" (every subscriber gets
    every chunk) or "work_sharing" (exactly one does); when_full: "wait" or
    "drop_oldest"; wake: "futex" or "poll"; page_policy, the chunks' pages: "normal",
    "huge-first" (2 MiB pages for a pool of more than 1 MiB where the broker has them)
    or "huge"."""

    def __init__(self, client, name: str, chunks: int = 64, chunk_bytes: int = 1 << 20, queue_depth: int = 16,
                 mode: str = "broadcast", when_full: str = "wait", wake: str = "futex",
                 read_only_chunks: bool = True, page_policy: str = "normal"):
        native = client.native if hasattr(client, "native") else client
        self._p = _membroker.ChannelPublisher(native, name, chunks, chunk_bytes, queue_depth, mode, when_full, wake,
                                              read_only_chunks, page_policy)

    def loan(self, nbytes: int, timeout_ms: int = 1000) -> Chunk:
        return Chunk(self._p.loan(nbytes, timeout_ms))

    def publish(self, chunk: Chunk, timeout_ms: int = 1000, size: int | None = None) -> None:
        if size is not None:
            chunk.size = size
        self._p.publish(chunk.native, timeout_ms)

    def discard(self, chunk: Chunk) -> None:
        self._p.discard(chunk.native)

    def wait_for_subscribers(self, n: int, timeout_ms: int = 1000) -> None:
        self._p.wait_for_subscribers(n, timeout_ms)

    def reap(self) -> int:
        return self._p.reap()

    @property
    def stats(self) -> dict:
        return self._p.stats

    def close(self) -> None:
        """Ends the channel: subscribers drain what is queued, then get NotConnected."""
        self._p.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class ChannelSubscriber:
    """Joins the channel published as `name` (waits lookup_timeout_ms for it)."""

    def __init__(self, client, name: str, wake: str = "futex", lookup_timeout_ms: int = 1000):
        native = client.native if hasattr(client, "native") else client
        self._s = _membroker.ChannelSubscriber(native, name, wake, lookup_timeout_ms)

    def receive(self, timeout_ms: int = 1000) -> Chunk:
        return Chunk(self._s.receive(timeout_ms))

    async def receive_async(self, timeout_ms: int = 1000) -> Chunk:
        """receive for asyncio: waits up to timeout_ms on the running loop (no
        thread) for a chunk; membroker.Timeout after, NotConnected when the
        publisher has gone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_ms / 1000.0
        fd = self._s.wake_fd()
        while True:
            try:
                return Chunk(self._s.receive(0))  # a TIMEOUT arms the fd
            except _errors.Timeout:
                left = deadline - loop.time()
                if left <= 0:
                    raise
            woken = loop.create_future()
            loop.add_reader(fd, lambda: woken.done() or woken.set_result(None))
            try:
                await asyncio.wait_for(woken, left)
            except asyncio.TimeoutError:
                pass
            finally:
                loop.remove_reader(fd)
            self._s.drain_wake_fd()

    def fileno(self) -> int:
        """The wake fd, for a selector of your own: readable when a chunk may be
        queued or the publisher has gone. Poll it after receive(0) raised
        membroker.Timeout, then drain_wake() and receive(0) again."""
        return self._s.wake_fd()

    def drain_wake(self) -> None:
        self._s.drain_wake_fd()

    def release(self, chunk: Chunk) -> None:
        self._s.release(chunk.native)

    def leave(self) -> None:
        self._s.leave()

    slot = property(lambda self: self._s.slot)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.leave()
