"""torch.multiprocessing through the broker: the one-line change.

    import membroker.torch
    membroker.torch.enable("/run/membroker.sock")   # before the processes start

From then on, a CPU tensor that torch.multiprocessing would share through
/dev/shm (put on a torch.multiprocessing Queue or Pipe, passed to a Process)
is shared through broker memory instead, as torch's own strategies do it: the
first time a tensor is sent, its storage moves into broker memory in place
(as share_memory_() moves it into /dev/shm), so sender and receivers see the
same pages from then on, and later sends of it copy nothing. A tensor already
in broker memory (Tensor.torch(), lookup_state_dict, a tensor received this
way) is sent without any copy, read-only where its memory is.

What travels in the pickle is the name of a one-shot publication of the
memory, taken back by the receiver when it maps it (as torch's file
descriptors are passed once). Nothing is a file: when any process is killed,
the broker gives back what it held, and a publication nobody took goes with
the process that made it. /dev/shm is never used.

CUDA tensors, sparse tensors and the rest go through torch's own reductions,
unchanged. Every process that sends tensors calls enable() (at import time of
the main module, so that spawned children do too); a process that only
receives needs nothing: the pickle says where the broker is.
"""
from __future__ import annotations

import os
import threading
import uuid
import warnings
import weakref

import torch
import torch.multiprocessing.reductions as _torch_reductions
from multiprocessing.reduction import ForkingPickler

from . import _dtypes
from ._client import _mapped, connect

_lock = threading.Lock()
_socket: str | None = None
_clients: dict = {}  # (pid, socket) -> Client: one per process (a forked child connects anew)


def enable(socket: str) -> None:
    """Shares CPU tensors of torch.multiprocessing through the broker at
    socket in this process (and in forked children, which inherit it)."""
    global _socket
    _socket = socket
    _client(socket)  # fail here, not in a queue's feeder thread, if the broker is not there
    for cls in {torch.Tensor, torch.nn.parameter.Parameter, *torch._tensor_classes}:
        ForkingPickler.register(cls, _reduce_tensor)


def disable() -> None:
    """torch's own reductions again."""
    global _socket
    _socket = None
    _torch_reductions.init_reductions()


def enabled() -> bool:
    return _socket is not None


def _client(socket: str):
    key = (os.getpid(), socket)
    with _lock:
        c = _clients.get(key)
        if c is None:
            c = _clients[key] = connect(socket, f"torch-mp-{os.getpid()}")
        return c


def _untyped(tensor):
    """The tensor's storage as bytes (torch 2: untyped_storage(); 1.13: storage().untyped())."""
    return tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage().untyped()


def _reduce_tensor(tensor):
    if (_socket is None or tensor.device.type != "cpu" or tensor.layout != torch.strided or
            type(tensor) not in (torch.Tensor, torch.nn.parameter.Parameter)):
        return _torch_reductions.reduce_tensor(tensor)
    if tensor.requires_grad and not tensor.is_leaf:
        raise RuntimeError("Cowardly refusing to serialize non-leaf tensor which requires_grad (as torch "
                           "does): call detach() on the tensor before sending it")
    client = _client(_socket)
    storage = _untyped(tensor)
    nbytes = storage.nbytes()
    # Already in memory of this broker, mapped by any client of this process?
    found = _mapped.find(storage.data_ptr(), nbytes) if nbytes else None
    if found is None or found[3].socket != _socket:
        _move_into_broker_memory(client, tensor, storage, nbytes)
        found = _mapped.find(_untyped(tensor).data_ptr(), nbytes)
    mapping, handle, storage_offset_bytes, owner = found
    name = f"torch-mp/{os.getpid()}/{uuid.uuid4().hex}"
    owner.publish(name, handle)  # goes when this process does, if nobody takes it
    element = _dtypes.dtype(tensor.dtype)
    return (_rebuild_tensor,
            (_socket, name, handle.id, mapping.read_only, element.name, tuple(tensor.shape), tuple(tensor.stride()),
             storage_offset_bytes, tensor.storage_offset(), nbytes, type(tensor) is torch.nn.parameter.Parameter,
             tensor.requires_grad))


def _move_into_broker_memory(client, tensor, storage, nbytes: int) -> None:
    """As share_memory_() moves a storage into /dev/shm: the tensor's whole
    storage is copied into broker memory and the tensor set onto it."""
    handle = client.malloc_physical(max(nbytes, 1))
    mapping = client.map_handle(handle)
    new = torch.frombuffer(memoryview(mapping), dtype=torch.uint8, count=max(nbytes, 1))[:nbytes]
    if nbytes:
        new.copy_(torch.tensor([], dtype=torch.uint8).set_(storage))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tensor.set_(_untyped(new), tensor.storage_offset(), tensor.size(), tensor.stride())


# Allocation id -> its mapping here, while it lives: a tensor received twice
# maps once (one Client holds a publication once).
_received: dict = {}


def _rebuild_tensor(socket, name, allocation, read_only, dtype, shape, stride, storage_offset_bytes, storage_offset,
                    storage_nbytes, is_parameter, requires_grad):
    client = _client(socket)
    mapping = None
    ref = _received.get((os.getpid(), allocation))
    if ref is not None:
        mapping = ref()
    if mapping is not None:
        client.unpublish(name)
    else:
        handle = client.lookup(name)
        client.unpublish(name)  # taken: the import holds the memory now
        mapping = client.map_handle(handle)
        _received[(os.getpid(), allocation)] = weakref.ref(mapping)
        weakref.finalize(mapping, _received.pop, (os.getpid(), allocation), None)
    t = _dtypes.torch_dtype(_dtypes.dtype(dtype))
    if storage_offset_bytes + storage_nbytes > mapping.size:
        raise ValueError(f"a tensor's storage of {storage_nbytes} bytes at {storage_offset_bytes} does not fit "
                         f"{mapping.size} bytes")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about read-only buffers: it has no read-only tensors
        flat = torch.frombuffer(memoryview(mapping), dtype=torch.uint8, count=storage_nbytes,
                                offset=storage_offset_bytes) if storage_nbytes else torch.empty(0, dtype=torch.uint8)
    tensor = torch.empty(0, dtype=t)
    if storage_nbytes:
        tensor.set_(_untyped(flat), storage_offset, shape, stride)
    else:
        tensor.resize_(shape)
    if is_parameter:
        return torch.nn.parameter.Parameter(tensor, requires_grad=requires_grad)
    tensor.requires_grad_(requires_grad)
    return tensor
