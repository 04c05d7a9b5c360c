"""Waiting in an asyncio event loop without a thread: one reader of a client's
wake fd per loop. It drains the fd, then wakes every coroutine waiting on that
client, and each looks at its own queue (name events, an engine's notifies).
A coroutine arms its future before it looks, so a wake that comes between its
look and its await is never lost."""
from __future__ import annotations

import asyncio
import weakref


class _Waker:
    def __init__(self, native, loop: asyncio.AbstractEventLoop):
        self._native = native
        self._loop = loop
        self._fd = native.wake_fd()
        self._armed: list[asyncio.Future] = []
        loop.add_reader(self._fd, self._on_readable)

    def _on_readable(self) -> None:
        self._native.drain_wake_fd()  # first: a byte sent after this wakes us again
        armed, self._armed = self._armed, []
        for f in armed:
            if not f.done():
                f.set_result(None)

    def arm(self) -> asyncio.Future:
        f = self._loop.create_future()
        self._armed.append(f)
        return f

    def close(self) -> None:
        """On the loop's thread: the reader goes, then the client (which owns the fd)."""
        if not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        for f in self._armed:
            f.cancel()
        self._armed = []
        self._native = None


# Per running loop (gone with it), per native client.
_wakers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def forget(native) -> None:
    """Client.close(): every loop lets go of this client's wake fd, on its own thread."""
    for loop, per_loop in list(_wakers.items()):
        w = per_loop.pop(id(native), None)
        if w is None or loop.is_closed():
            continue
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            w.close()
        else:
            loop.call_soon_threadsafe(w.close)


def _waker(native) -> _Waker:
    loop = asyncio.get_running_loop()
    per_loop = _wakers.setdefault(loop, {})
    w = per_loop.get(id(native))
    if w is None or w._native is not native:
        w = per_loop[id(native)] = _Waker(native, loop)
    return w


async def wait_until(native, take, timeout_ms: int):
    """Calls take() (which must not block) until it returns something true or
    timeout_ms passes; returns its last result. Sleeps on the wake fd between."""
    if timeout_ms < 0:
        raise ValueError("timeout_ms must be >= 0")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_ms / 1000.0
    waker = _waker(native)
    while True:
        armed = waker.arm()
        got = take()
        left = deadline - loop.time()
        if got or left <= 0:
            armed.cancel()
            return got
        try:
            await asyncio.wait_for(armed, left)
        except asyncio.TimeoutError:
            pass
