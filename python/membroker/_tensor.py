"""Tensors in broker memory: a mapping plus dtype, shape and strides."""
from __future__ import annotations

import json
from typing import Sequence

from . import _dtypes

# numpy is imported where needed, torch only when asked for: the package
# works without either.


def _np():
    import numpy
    return numpy


class Tensor:
    """A tensor whose bytes live in one broker allocation, mapped into this
    process. .numpy() and .torch() are views over the same pages (no copy);
    each keeps the mapping alive for as long as it lives; after close() there
    are no new ones (NotMapped). .read_only is true for tensors looked up from
    a read-only publication: their pages are mapped read-only, so a numpy view
    is not writeable, and a write through a torch view (torch has no read-only
    tensors) is a SIGSEGV - use .numpy() where it matters. One process holds a
    publication once per Client: looking the same name up again through the
    same Client raises AlreadyExists while the first Tensor (or a view of it)
    lives."""

    def __init__(self, handle, mapping, dtype, shape: Sequence[int], strides: Sequence[int] | None = None,
                 offset: int = 0, user_metadata: dict | None = None):
        self.handle = handle
        self.mapping = mapping
        self.user_metadata = user_metadata  # what publish_tensor(metadata=) gave, or None
        self.element = _dtypes.dtype(dtype)  # the canonical type, as it travels
        self.shape = tuple(int(s) for s in shape)
        itemsize = self.element.itemsize
        if strides is None:  # C order
            strides, step = [], itemsize
            for s in reversed(self.shape):
                strides.insert(0, step)
                step *= s
        self.strides = tuple(int(s) for s in strides)
        self.offset = int(offset)
        extent = self.offset + (sum((n - 1) * st for n, st in zip(self.shape, self.strides)) + itemsize
                                if all(self.shape) else 0)
        if (self.offset < 0 or any(st < 0 or st % itemsize for st in self.strides) or self.offset % itemsize or
                extent > mapping.size):
            raise ValueError(f"a {self.element.name} tensor of shape {self.shape} and strides {self.strides} at "
                             f"offset {self.offset} does not fit {mapping.size} bytes")

    @property
    def dtype(self):
        """numpy's dtype, where numpy has this type (TypeError for bfloat16,
        complex32 and the float8 types: see .element and .torch())."""
        return _dtypes.numpy_dtype(self.element)

    @property
    def read_only(self) -> bool:
        return self.mapping.read_only

    @property
    def device(self) -> str:
        """Where the bytes are: "cpu", or "cuda:N" for CUDA device N's memory."""
        n = getattr(self.mapping, "device", None)
        return "cpu" if n is None else f"cuda:{n}"

    def _check_host(self, view: str):
        if self.device != "cpu":
            raise TypeError(f"this tensor is in {self.device} memory, which the CPU cannot read: {view} views "
                            "host memory only; use __cuda_array_interface__ or DLPack (torch.as_tensor(t, "
                            "device='cuda'), cupy.asarray(t))")

    @property
    def __cuda_array_interface__(self) -> dict:
        """Version 3, for device tensors: the pointer, dtype, shape and
        strides (in bytes), read-only flag; "stream": None (membroker enqueues
        no work on it)."""
        if self.device == "cpu":
            raise AttributeError("__cuda_array_interface__: this tensor is in host memory")
        self._check_open()
        base = self.mapping.__cuda_array_interface__
        return {"shape": self.shape, "typestr": _dtypes.typestr(self.element), "strides": self.strides,
                "data": (base["data"][0] + self.offset, self.read_only), "stream": None, "version": 3}

    @property
    def nbytes(self) -> int:
        n = self.element.itemsize
        for s in self.shape:
            n *= s
        return n

    def _check_open(self):
        if self.mapping.closed:
            from ._errors import NotMapped  # pylint: disable=no-name-in-module
            raise NotMapped("the tensor is closed: no new views (those made before stay valid)")

    def numpy(self):
        """An ndarray over the tensor's pages (not writeable when read-only).
        Its .base holds the mapping, which stays mapped while the array lives."""
        self._check_open()
        self._check_host("numpy")
        np = _np()
        return np.ndarray(shape=self.shape, dtype=self.dtype, buffer=self.mapping, offset=self.offset,
                          strides=self.strides)

    def torch(self):
        """A torch tensor over the tensor's pages, built from the bytes without
        numpy (so bfloat16 and the types numpy lacks work). It holds the
        mapping, which stays mapped while the tensor lives."""
        import torch
        import warnings
        self._check_open()
        if self.device != "cpu":
            if not self.read_only:
                return torch.as_tensor(self, device=self.device)  # through __cuda_array_interface__: no copy
            # torch refuses a read-only __cuda_array_interface__ ("the read only
            # flag is not supported", torch 2.11 on an H200): it has no read-only
            # tensors, so it gets a view that does not say so, as frombuffer does
            # below. The memory is mapped read-only: a write faults on the GPU.
            warnings.warn("torch has no read-only tensors: this one views read-only device memory, and a write "
                          "to it is an illegal address on the GPU", stacklevel=2)
            return torch.as_tensor(_WritableView(self), device=self.device)
        t = _dtypes.torch_dtype(self.element)
        itemsize = self.element.itemsize
        if not self.nbytes:
            return torch.empty(self.shape, dtype=t)
        count = (self.offset + sum((n - 1) * st for n, st in zip(self.shape, self.strides)) + itemsize) // itemsize
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch warns about read-only buffers: it has no read-only tensors
            flat = torch.frombuffer(memoryview(self.mapping), dtype=t, count=count)
        return flat.as_strided(self.shape, [st // itemsize for st in self.strides], self.offset // itemsize)

    def metadata(self, user: dict | None = None) -> bytes:
        """What travels with a published tensor: its layout, and the user's
        dict under "user"."""
        meta = {"dtype": self.element.name, "shape": list(self.shape), "strides": list(self.strides),
                "offset": self.offset}
        if user is not None:
            if not isinstance(user, dict):
                raise TypeError(f"metadata must be a dict of JSON values, not {type(user).__name__}")
            meta["user"] = user
        return json.dumps(meta).encode()

    @staticmethod
    def parse_metadata(blob: bytes) -> dict:
        try:
            meta = json.loads(blob.decode())
            user = meta.get("user")
            if user is not None and not isinstance(user, dict):
                raise TypeError("user metadata is not a dict")
            return {"dtype": str(meta["dtype"]), "shape": [int(x) for x in meta["shape"]],
                    "strides": [int(x) for x in meta["strides"]], "offset": int(meta.get("offset", 0)),
                    "user": user}
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"not a membroker tensor's metadata: {blob[:80]!r}") from e

    def close(self):
        """No new views; the memory stays mapped while existing ones live."""
        self.mapping.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"membroker.Tensor(dtype={self.element.name}, shape={self.shape}, read_only={self.read_only})"


class _WritableView:
    """A device tensor's __cuda_array_interface__ without its read-only flag,
    for torch (Tensor.torch): it holds the tensor, so the mapping stays."""

    def __init__(self, tensor: Tensor):
        self._tensor = tensor
        cai = dict(tensor.__cuda_array_interface__)
        cai["data"] = (cai["data"][0], False)
        self.__cuda_array_interface__ = cai
