"""The transfer engine (docs/TRANSFER.md)."""
from __future__ import annotations

from . import _membroker, _waker


class TransferEngine:
    """HIXL's transfer engine over a Client: register_mem(mapping) -> id,
    deregister_mem(id), connect(remote, timeout_ms), disconnect(remote, timeout_ms),
    transfer_sync(remote, "read" | "write", [(local_addr, remote_addr, length), ...], timeout_ms),
    transfer_async(...) -> request, transfer_status(request) -> "waiting" | "completed" | "timeout" | "failed",
    send_notify(remote, name, message), get_notifies() -> [(from, name, message)],
    wait_notifies(timeout_ms), await wait_notifies_async(timeout_ms), fileno(), finalize().
    A registered mapping stays alive until it is deregistered. Options: copy_threads,
    async_threads, drain_timeout_ms (strings, as HIXL's); for engines on other hosts
    (docs/TRANSFER.md) listen_address ("ip:port"), secret_file and allow_from, then
    connect("ip:port"), connection_info(remote) -> {"path": "ucx" | "same-host", ...} and
    network_stats() -> {"listen_address", "accepted", "refused", ...}."""

    def __init__(self, client, name: str, options: dict | None = None):
        native = client.native if hasattr(client, "native") else client
        self._client = native
        self._e = _membroker.TransferEngine(native, name, {k: str(v) for k, v in (options or {}).items()})

    def wait_notifies(self, timeout_ms: int = 1000) -> list:
        """Waits up to timeout_ms for a notify, then takes every one queued
        ([(from, name, message)]; [] when the time ran out). It reads the
        client's wake fd: not while an event loop reads it too."""
        return self._e.wait_notifies(timeout_ms)

    async def wait_notifies_async(self, timeout_ms: int = 1000) -> list:
        """wait_notifies for asyncio: waits on the running loop, no thread."""
        return await _waker.wait_until(self._client, self._e.get_notifies, timeout_ms) or []

    def fileno(self) -> int:
        """The client's wake fd (Client.fileno): readable when a notify may be queued."""
        return self._client.wake_fd()

    def __getattr__(self, attr):
        return getattr(self._e, attr)
