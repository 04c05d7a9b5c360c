"""The Pythonic client: membroker.connect() and what it returns."""
from __future__ import annotations

import weakref
from typing import Sequence

from . import _dtypes, _errors, _membroker, _state_dict, _waker
from ._tensor import Tensor, _np


class Client:
    """One connection to membrokerd (thread-safe). Use it as a context
    manager, or call close(); everything the process holds is released by
    the broker when the process ends, whatever way it ends."""

    def __init__(self, native, socket: str = ""):
        self._c = native
        self.socket = socket  # the broker's, as given to connect
        self._registered = {}  # host_register'ed address -> the buffer, kept alive

    # -- the connection ---------------------------------------------------------------------------------
    @property
    def client_id(self) -> int:
        return self._c.client_id

    @property
    def cluster_host(self) -> str:
        """This host's name in the broker's cluster (membrokerd --host-name); "" without one."""
        return self._c.cluster_host

    def ping(self) -> None:
        """One round trip to the broker."""
        self._c.ping()

    @property
    def reattaches(self) -> int:
        """How often this client reattached to a new broker (docs/RESTART.md)."""
        return self._c.reattaches

    def wait_for_reattach(self, count: int = 1, timeout_ms: int = 10000) -> None:
        """Waits until reattaches >= count; raises membroker.Timeout otherwise."""
        self._c.wait_for_reattach(count, timeout_ms)

    def close(self) -> None:
        """Drops this object's hold on the connection (it closes when the last
        handle and mapping made through it are gone too)."""
        if self._c is not None:
            _waker.forget(self._c)
        self._c = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @property
    def native(self):
        if self._c is None:
            raise _errors.NotConnected("this Client is closed", _errors.NotConnected.code)
        return self._c

    # -- the VMM path -----------------------------------------------------------------------------------
    def malloc_physical(self, size: int, page_policy: str = "normal", pinned: bool = False,
                        same_address: bool = False, exported: bool = False, export_flags: int = 0,
                        device: int | None = None):
        """Broker memory of at least `size` bytes (rounded to the page size):
        a PhysicalHandle. page_policy: normal, huge-first, huge, huge1g.
        device=N: CUDA device N's memory (handle.device says so)."""
        return self.native.malloc_physical(size, page_policy, pinned, same_address, exported, export_flags, device)

    def reserve(self, size: int, alignment: int = 0, device: bool = False):
        """An address range of this process, reserved (not yet backed);
        device=True: device addresses, for device memory."""
        return self.native.reserve(size, alignment, device)

    def map(self, reservation, handle, at: int = 0, size: int = 0, offset: int = 0, populate: bool = False):
        """Maps handle (from offset, size bytes; all by default) at reservation.base + at: a
        Mapping, which supports the buffer protocol, __array_interface__ and DLPack."""
        mapping = self.native.map(reservation, handle, at, size, offset, populate)
        _mapped.add(mapping, handle, offset, self)
        return mapping

    def map_handle(self, handle):
        """Reserves a range for the whole handle and maps it there (device
        addresses for device memory: a DeviceMapping)."""
        return self.map(self.reserve(handle.size, device=handle.device is not None), handle)

    def set_access(self, mapping, access: str) -> None:
        """'none', 'read' or 'read-write' for the whole mapping."""
        self.native.set_access(mapping, access)

    # -- sharing ---------------------------------------------------------------------------------------
    def export(self, handle, no_pid_check: bool = False, read_only: bool = False) -> str:
        """A token another process may import (after set_pids, or any process of this uid
        with no_pid_check)."""
        return self.native.export(handle, no_pid_check, read_only)

    def set_pids(self, token: str, pids: Sequence[int]) -> None:
        self.native.set_pids(token, list(pids))

    def import_handle(self, token: str):
        return self.native.import_handle(token)

    # -- host memory ---------------------------------------------------------------------------------
    def malloc_host(self, size: int):
        """Pinned host memory (aclrtMallocHost): a HostBuffer (buffer protocol), freed when the
        last view of it is gone."""
        return self.native.malloc_host(size)

    def host_register(self, buffer) -> int:
        """Pins this process's own memory (aclrtHostRegister): a writable buffer whose address and
        size are multiples of 4096. The buffer is kept alive until host_unregister."""
        address = self.native.host_register(buffer)
        self._registered[address] = buffer
        return address

    def host_unregister(self, buffer_or_address) -> None:
        address = buffer_or_address if isinstance(buffer_or_address, int) else \
            next((a for a, b in self._registered.items() if b is buffer_or_address), None)
        if address is None:
            raise _errors.NotFound("this buffer is not registered", _errors.NotFound.code)
        self.native.host_unregister(address)
        self._registered.pop(address, None)

    # -- events ----------------------------------------------------------------------------------------
    def subscribe(self, prefix: str = "", cluster: bool = False) -> None:
        """Events for names under prefix: published, unpublished, holder_died.
        cluster=True: also those of names other hosts publish for the cluster
        (published, unpublished, host_gone; each event's "host" says whose;
        docs/CLUSTER.md). membroker.Unsupported without a cluster."""
        self.native.subscribe(prefix, cluster)

    def wait_events(self, timeout_ms: int = 0):
        """(events, dropped): each event a dict with kind, name, allocation, pid; waits in the broker
        up to timeout_ms for one."""
        return self.native.wait_events(timeout_ms)

    async def wait_events_async(self, timeout_ms: int = 1000):
        """wait_events for asyncio: (events, dropped), waiting up to timeout_ms on the
        running loop (no thread): it sleeps on fileno() between looks."""
        def take():
            events, dropped = self.native.wait_events(0)
            return (events, dropped) if events else None

        got = await _waker.wait_until(self.native, take, timeout_ms)
        return got if got else self.native.wait_events(0)

    def fileno(self) -> int:
        """The wake fd, for a selector or event loop of your own: readable when a name
        event or a notify for this client's engine may be queued. Call drain_wake(),
        then take what is queued (wait_events(0), engine.get_notifies()), in that
        order. One reader at a time: your loop, the *_async waits (which read it in
        the running asyncio loop) or a blocking wait_notifies."""
        return self.native.wake_fd()

    def drain_wake(self) -> None:
        self.native.drain_wake_fd()

    # -- named objects ---------------------------------------------------------------------------------
    def publish(self, name: str, handle, read_only: bool = False, persist: bool = False,
                metadata: bytes = b"", replace: bool = False, cluster: bool = False) -> None:
        """Publishes handle's allocation under name. replace: a name this user
        already published is swapped to it in one step (lookups from then on
        get the new one; holders of the old keep theirs). persist: the name
        outlives this process until unpublished (and a broker crash only where
        something keeps the broker's memory: docs/RESTART.md). cluster: every
        host of the broker's cluster finds it with lookup_cluster
        (docs/CLUSTER.md; membroker.Unsupported without one)."""
        self.native.publish(handle, name, read_only, persist, metadata, replace, cluster)

    def lookup(self, name: str, timeout_ms: int = 0):
        """The handle published as name, waiting up to timeout_ms (membroker.Timeout after)."""
        return self.native.lookup(name, timeout_ms)

    def lookup_cluster(self, name: str, timeout_ms: int = 0) -> dict:
        """Where a name published with cluster=True lives, on any host of the
        cluster: {"host", "generation", "size", "read_only", "metadata"};
        waits up to timeout_ms (membroker.Timeout after; 0: membroker.NotFound
        at once); membroker.NotConnected while etcd is out of reach."""
        return self.native.lookup_cluster(name, timeout_ms)

    def fetch_named(self, engine, name: str, timeout_ms: int = 0) -> dict:
        """A name published read-only for the cluster (cluster=True,
        read_only=True) on another host, copied into new broker memory here
        through engine (a TransferEngine of this client) and that host's
        membroker-share, every byte checked against the share's checksum:
        {"handle", "host", "generation", "size", "metadata", "copied"}. On this
        host already: the object itself (copied False). Waits up to timeout_ms
        in all. membroker.Unsupported for a name not read-only,
        membroker.DataLoss for bytes that fail their checksum (docs/CLUSTER.md)."""
        return engine._e.fetch_named(name, timeout_ms)

    def fetch_tensor(self, engine, name: str, timeout_ms: int = 0) -> Tensor:
        """A tensor published with publish_tensor(..., cluster=True) on another
        host (read-only), copied here as fetch_named does and mapped."""
        f = self.fetch_named(engine, name, timeout_ms)
        meta = Tensor.parse_metadata(f["metadata"])
        handle = f["handle"]
        return Tensor(handle, self.map_handle(handle), meta["dtype"], meta["shape"], meta["strides"],
                      meta["offset"], meta["user"])

    def unpublish(self, name: str) -> None:
        self.native.unpublish(name)

    def list_names(self, prefix: str = "") -> list[dict]:
        return self.native.list_names(prefix)

    # -- tensors ---------------------------------------------------------------------------------------
    def new_tensor(self, shape: Sequence[int], dtype="float32", page_policy: str = "normal",
                   device: int | None = None) -> Tensor:
        """An uninitialised C-order tensor in fresh broker memory, mapped here.
        dtype: a string ("bfloat16", "float8_e4m3fn", "<f4"), a numpy dtype or a
        torch dtype; every type numpy or torch has. device=N: in CUDA device
        N's memory (views through __cuda_array_interface__ and DLPack)."""
        element = _dtypes.dtype(dtype)
        nbytes = element.itemsize
        for s in shape:
            nbytes *= int(s)
        if device is not None:
            handle = self.malloc_physical(max(nbytes, 1), device=device)
            return Tensor(handle, self.map_handle(handle), element, shape)
        handle = self.malloc_physical(max(nbytes, 1), page_policy)
        return Tensor(handle, self.map_handle(handle), element, shape)

    def tensor_from(self, array, page_policy: str = "normal") -> Tensor:
        """A broker-memory copy of a torch tensor (any dtype, on any device: its
        bytes are copied, not converted), a numpy array, or anything
        np.asarray takes."""
        if type(array).__module__.startswith("torch") and hasattr(array, "dtype") and hasattr(array, "storage"):
            t = self.new_tensor(tuple(array.shape), array.dtype, page_policy)
            if t.nbytes:
                t.torch().copy_(array.detach())
            return t
        np = _np()
        src = np.ascontiguousarray(np.asarray(array))
        t = self.new_tensor(src.shape, src.dtype, page_policy)
        t.numpy()[...] = src
        return t

    def publish_tensor(self, name: str, tensor: Tensor, read_only: bool = False, persist: bool = False,
                       metadata: dict | None = None, replace: bool = False, cluster: bool = False) -> None:
        """Publishes the tensor's memory under name with its dtype, shape and
        strides, and metadata (a dict of JSON values, given back as
        .user_metadata by lookup_tensor; all of it at most 4 KiB)."""
        self.publish(name, tensor.handle, read_only, persist, tensor.metadata(metadata), replace, cluster)

    def lookup_tensor(self, name: str, timeout_ms: int = 0) -> Tensor:
        """The tensor published as name, mapped here (read-only if published so)."""
        handle = self.lookup(name, timeout_ms)
        meta = Tensor.parse_metadata(handle.metadata)
        return Tensor(handle, self.map_handle(handle), meta["dtype"], meta["shape"], meta["strides"],
                      meta["offset"], meta["user"])

    # -- state dicts -----------------------------------------------------------------------------------
    def publish_state_dict(self, name: str, state_dict, read_only: bool = True, persist: bool = False,
                           replace: bool = False, page_policy: str = "normal") -> None:
        """Publishes every tensor of state_dict (a mapping of str to torch
        tensors or numpy arrays) under one name, in one allocation, in one
        step: a reader sees the whole dict or nothing. replace: swaps a new
        version in for new readers while readers of the old keep their pages."""
        _state_dict.publish(self, name, state_dict, read_only, persist, replace, page_policy)

    def lookup_state_dict(self, name: str, timeout_ms: int = 0, framework: str = "torch") -> dict:
        """The state dict published as name: a dict of torch tensors
        (framework="numpy": ndarrays) over the broker's pages, no copy; read-only
        pages where it was published read-only (a write through a torch view of
        them is a SIGSEGV: torch has no read-only tensors)."""
        return _state_dict.lookup(self, name, timeout_ms, framework)


class _MappedMemory:
    """Broker memory mapped in this process, by address, for as long as each
    mapping lives: what membroker.torch needs to send a tensor that already
    lives there by name instead of copying it."""

    def __init__(self):
        self._by_address = {}  # address -> (weakref to the Mapping, handle, offset into it, client)

    def add(self, mapping, handle, offset, client):
        address = mapping.address
        self._by_address[address] = (weakref.ref(mapping), handle, offset, client)
        weakref.finalize(mapping, self._by_address.pop, address, None)

    def find(self, pointer: int, nbytes: int):
        """(mapping, handle, offset of pointer in the allocation, client) of a
        live mapping that holds [pointer, pointer + nbytes), or None."""
        for address, (ref, handle, offset, client) in list(self._by_address.items()):
            mapping = ref()
            if mapping is not None and address <= pointer and pointer + nbytes <= address + mapping.size:
                return mapping, handle, offset + pointer - address, client
        return None


_mapped = _MappedMemory()


def connect(socket: str, name: str = "", call_timeout_ms: int = 30000, reattach: bool = True) -> Client:
    """Connects to the broker at `socket` (one round trip). call_timeout_ms bounds how long
    any call waits for the broker beyond what it asks the broker to wait. With reattach,
    the client reattaches to the next broker on the socket by itself when this one goes
    away, keeping its handles, mappings, exports and names (docs/RESTART.md)."""
    return Client(_membroker.Client.connect(socket, name, call_timeout_ms, reattach), socket)


__all__ = ["Client", "connect"]
