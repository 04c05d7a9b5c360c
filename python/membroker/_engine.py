"""The transfer engine (docs/TRANSFER.md)."""
from __future__ import annotations

from . import _membroker, _waker


def _pointer_of(obj) -> tuple[int, int, str]:
    """(address, bytes, what) of a torch tensor (host or CUDA), an object with
    __cuda_array_interface__ (a membroker device Tensor), a numpy array or a
    buffer, which must be contiguous: a transfer moves one run of bytes. The
    engine then checks it lies in memory it registered."""
    what = type(obj).__module__ + "." + type(obj).__qualname__
    if type(obj).__name__ == "Tensor" and hasattr(obj, "mapping") and obj.device == "cpu":
        obj = obj.numpy()  # a membroker Tensor in host memory: its bytes
    if type(obj).__module__.startswith("torch"):
        if not obj.is_contiguous():
            raise ValueError(f"a {what} of shape {tuple(obj.shape)} and strides {obj.stride()} is not "
                             "contiguous: pass .contiguous() memory, or one descriptor per contiguous piece")
        return obj.data_ptr(), obj.numel() * obj.element_size(), what
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is not None:
        shape, itemsize = tuple(cai["shape"]), int(cai["typestr"][2:])
        contiguous, step = [], itemsize
        for extent in reversed(shape):
            contiguous.insert(0, step)
            step *= extent
        if cai.get("strides") not in (None, tuple(contiguous)):
            raise ValueError(f"a {what} of shape {shape} and strides {cai['strides']} is not contiguous")
        return cai["data"][0], step, what
    try:
        import numpy as np
        a = obj if isinstance(obj, np.ndarray) else np.frombuffer(obj, dtype=np.uint8)
    except (TypeError, ValueError):
        raise TypeError(f"a {what} is not memory: give a Mapping, a membroker Tensor, a torch tensor, "
                        "a numpy array or a buffer") from None
    if not a.flags.c_contiguous:
        raise ValueError(f"a {what} of shape {a.shape} and strides {a.strides} is not contiguous")
    return a.__array_interface__["data"][0], a.nbytes, what


class TransferEngine:
    """HIXL's transfer engine over a Client: register_mem(memory) -> id,
    deregister_mem(id), connect(remote, timeout_ms), disconnect(remote, timeout_ms),
    transfer_sync(remote, "read" | "write", descs, timeout_ms),
    transfer_async(...) -> request, transfer_status(request) -> "waiting" | "completed" | "timeout" | "failed",
    send_notify(remote, name, message), get_notifies() -> [(from, name, message)],
    wait_notifies(timeout_ms), await wait_notifies_async(timeout_ms), fileno(), finalize();
    register_mem(memory, name=) and remote_regions(remote) -> {name: {"address", ...}}: a
    connected peer's ranges found by the names it gave them.
    A descriptor is (local_address, remote_address, length), or (local, remote) where
    local is a torch tensor, numpy array or buffer (a slice of one too) in registered
    memory, whose address and length are taken from it, and remote is an address, the
    name of a range the remote registered, or (name, offset). A registered
    mapping stays alive until it is deregistered. Options: copy_threads,
    async_threads, drain_timeout_ms (strings, as HIXL's); for engines on other hosts
    (docs/TRANSFER.md) listen_address ("ip:port"), secret_file and allow_from, then
    connect("ip:port"), connection_info(remote) -> {"path": "ucx" | "same-host", ...} and
    network_stats() -> {"listen_address", "accepted", "refused", ...}."""

    def __init__(self, client, name: str, options: dict | None = None):
        native = client.native if hasattr(client, "native") else client
        self._client = native
        self._e = _membroker.TransferEngine(native, name, {k: str(v) for k, v in (options or {}).items()})

    def register_mem(self, memory, name: str = "") -> int:
        """Registers broker memory mapped in this process: a Mapping, a
        DeviceMapping (device memory, moved between engines of this host with
        the CUDA driver's copies), a membroker Tensor, or a torch tensor, numpy
        array or buffer that lies in one (the whole mapping it lies in is
        registered). name (up to 32 bytes, unique in this engine) is how
        connected peers find it: remote_regions(). The id is for deregister_mem."""
        from ._client import _mapped
        if isinstance(memory, (_membroker.Mapping, _membroker.DeviceMapping)):
            return self._e.register_mem(memory, name)
        if type(memory).__name__ == "Tensor" and hasattr(memory, "mapping"):  # a membroker Tensor
            return self._e.register_mem(memory.mapping, name)
        address, nbytes, what = _pointer_of(memory)
        found = _mapped.find(address, max(nbytes, 1))
        if found is None:
            raise _membroker_error("ParamInvalid", f"a {what} at {address:#x} ({nbytes} bytes) is not in broker "
                                   "memory mapped by this process: only broker memory is registered "
                                   "(client.new_tensor, lookup_tensor, map)")
        return self._e.register_mem(found[0], name)

    def remote_regions(self, remote: str, timeout_ms: int = 1000) -> dict:
        """The named ranges a connected remote engine has registered now:
        {name: {"address", "length", "read_only"}}. A descriptor's remote
        address is region["address"] plus an offset into it."""
        return {r["name"]: {"address": r["address"], "length": r["length"], "read_only": r["read_only"]}
                for r in self._e.remote_regions(remote, timeout_ms) if r["name"]}

    def transfer_sync(self, remote: str, op: str, descs, timeout_ms: int = 1000) -> None:
        self._e.transfer_sync(remote, op, self._descs(remote, descs, timeout_ms), timeout_ms)

    def transfer_async(self, remote: str, op: str, descs, timeout_ms: int = 1000) -> int:
        return self._e.transfer_async(remote, op, self._descs(remote, descs, timeout_ms), timeout_ms)

    def _descs(self, remote: str, descs, timeout_ms: int) -> list[tuple[int, int, int]]:
        """(address, remote_address, length) for each descriptor; a remote given
        by region name ("kv" or ("kv", offset)) is looked up once per call."""
        out, regions = [], None
        for i, d in enumerate(descs):
            if len(d) == 3 and all(isinstance(x, int) for x in d):
                out.append(tuple(d))
                continue
            if len(d) != 2:
                raise TypeError(f"descriptor {i}: ({', '.join(type(x).__name__ for x in d)}) is neither "
                                "(local_address, remote_address, length) nor (tensor, remote)")
            local, where = d
            try:
                address, nbytes, _ = _pointer_of(local)
            except (TypeError, ValueError) as e:
                raise type(e)(f"descriptor {i}: {e}") from None
            if isinstance(where, str):
                where = (where, 0)
            if isinstance(where, tuple) and len(where) == 2 and isinstance(where[0], str) and isinstance(where[1], int):
                if regions is None:
                    regions = self.remote_regions(remote, timeout_ms)
                name, offset = where
                region = regions.get(name)
                if region is None:
                    raise _membroker_error("NotFound", f"descriptor {i}: engine \"{remote}\" has no range named "
                                           f"\"{name}\" (it has: {', '.join(sorted(regions)) or 'none'})")
                if offset < 0 or offset + nbytes > region["length"]:
                    raise _membroker_error("ParamInvalid", f"descriptor {i}: {nbytes} bytes at offset {offset} fall "
                                           f"outside \"{name}\" ({region['length']} bytes)")
                where = region["address"] + offset
            if not isinstance(where, int):
                raise TypeError(f"descriptor {i}: the remote side is a {type(where).__name__}: give an address, "
                                "a region name, or (region name, offset)")
            out.append((address, where, nbytes))
        return out

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


def _membroker_error(cls: str, message: str):
    from . import _errors
    c = getattr(_errors, cls)
    return c(message, c.code)
