"""membroker: zero-copy memory between processes, and nothing left behind.

    import membroker
    with membroker.connect("/run/membroker.sock", "loader") as client:
        t = client.new_tensor((1024, 1024), "float32")   # broker memory, mapped here
        t.numpy()[:] = 1.0                               # written in place
        client.publish_tensor("weights/layer0", t, read_only=True)

    # in another process:
        w = client.lookup_tensor("weights/layer0", timeout_ms=5000)
        arr = w.numpy()          # the same pages, no copy; read-only as published

Every call returns its result or raises a membroker.Error subclass named after
the wire error code (membroker.Timeout, membroker.NotConnected, ...; .code and
.code_name say which). Calls that wait for the broker release the GIL. Views
(memoryview, numpy arrays, torch tensors, DLPack capsules) keep their memory
mapped until the last one is gone.
"""
from __future__ import annotations

from . import _errors
from ._errors import *  # noqa: F401,F403  (Error and one class per wire code)
from ._tensor import Tensor  # noqa: F401
from ._client import Client, connect  # noqa: F401
from ._engine import TransferEngine  # noqa: F401
from ._ring import TensorRing  # noqa: F401
from ._channel import ChannelPublisher, ChannelSubscriber, Chunk  # noqa: F401
from ._kv import KvLeases, KvPut, KvStore  # noqa: F401

__all__ = ["connect", "Client", "Tensor", "TensorRing", "TransferEngine", "ChannelPublisher", "ChannelSubscriber",
           "Chunk", "KvStore", "KvLeases", "KvPut"] + _errors.__all__
