"""The transfer engine (docs/TRANSFER.md)."""
from __future__ import annotations

from . import _membroker


class TransferEngine:
    """HIXL's transfer engine over a Client: register_mem(mapping) -> id,
    deregister_mem(id), connect(remote, timeout_ms), disconnect(remote, timeout_ms),
    transfer_sync(remote, "read" | "write", [(local_addr, remote_addr, length), ...], timeout_ms),
    transfer_async(...) -> request, transfer_status(request) -> "waiting" | "completed" | "timeout" | "failed",
    send_notify(remote, name, message), get_notifies() -> [(from, name, message)], finalize().
    A registered mapping stays alive until it is deregistered. Options: copy_threads,
    async_threads, drain_timeout_ms (strings, as HIXL's); for engines on other hosts
    (docs/TRANSFER.md) listen_address ("ip:port"), secret_file and allow_from, then
    connect("ip:port"), connection_info(remote) -> {"path": "ucx" | "same-host", ...} and
    network_stats() -> {"listen_address", "accepted", "refused", ...}."""

    def __init__(self, client, name: str, options: dict | None = None):
        native = client.native if hasattr(client, "native") else client
        self._e = _membroker.TransferEngine(native, name, {k: str(v) for k, v in (options or {}).items()})

    def __getattr__(self, attr):
        return getattr(self._e, attr)
