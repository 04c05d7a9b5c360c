"""Whole state dicts under one name (Client.publish_state_dict and
lookup_state_dict).

Every tensor of the dict goes into one broker allocation, after a manifest
that says where each one is; the allocation is published under the name in
one request. So a reader finds the whole dict or nothing: there is no moment
at which some tensors are published and others not, and a publisher that dies
while copying leaves no name and no memory behind. replace=True swaps a new
version in under the same name in that one request; readers of the old
version keep their pages until they let go.

The allocation's layout: the manifest (UTF-8 JSON) at offset 0, then each
tensor's bytes, C order, at a multiple of 64. The name's metadata says which
layout it is and how long the manifest is. A reader trusts none of it: the
manifest must parse and every tensor must fit the allocation (Tensor checks
its extent), else ValueError.
"""
from __future__ import annotations

import json

from . import _dtypes
from ._tensor import Tensor, _np

KIND = "membroker.state_dict"
FORMAT = 1
_ALIGN = 64


def _is_torch(value) -> bool:
    return type(value).__module__.startswith("torch") and hasattr(value, "dtype") and hasattr(value, "storage")


def _round_up(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def publish(client, name: str, state_dict, read_only: bool, persist: bool, replace: bool, page_policy: str) -> None:
    entries, sources = [], []
    for key, value in state_dict.items():
        if not isinstance(key, str):
            raise TypeError(f"state dict keys are strings, not {type(key).__name__} ({key!r})")
        if not _is_torch(value):
            value = _np().asarray(value)
            if value.dtype == object:
                raise TypeError(f"state dict entry {key!r} is not a tensor or array")
        element = _dtypes.dtype(value.dtype)
        shape = [int(s) for s in value.shape]
        entries.append({"name": key, "dtype": element.name, "shape": shape})
        sources.append((value, element, shape))
    # Offsets depend on the manifest's length, which depends on the offsets'
    # digits: lay the data out after a generous guess, then check it.
    start = _round_up(len(json.dumps({"tensors": entries}).encode()) + 32 * len(entries) + 64)
    offset = start
    for entry, (_, element, shape) in zip(entries, sources):
        nbytes = element.itemsize
        for s in shape:
            nbytes *= s
        entry["offset"] = offset
        offset = _round_up(offset + nbytes)
    manifest = json.dumps({"tensors": entries}).encode()
    if len(manifest) > start:  # 32 bytes an entry hold any offset's digits: never
        raise RuntimeError(f"a state dict manifest of {len(manifest)} bytes outgrew its {start}")
    handle = client.malloc_physical(max(offset, 1), page_policy)
    mapping = client.map_handle(handle)
    try:
        memoryview(mapping)[:len(manifest)] = manifest
        for entry, (value, element, shape) in zip(entries, sources):
            t = Tensor(handle, mapping, element, shape, None, entry["offset"])
            if not t.nbytes:
                continue
            if _is_torch(value):
                t.torch().copy_(value.detach().reshape(shape))
            else:
                t.numpy()[...] = value
        meta = json.dumps({"kind": KIND, "format": FORMAT, "manifest_bytes": len(manifest),
                           "tensors": len(entries)}).encode()
        client.publish(name, handle, read_only, persist, meta, replace)
    finally:
        # The publication holds the memory from here on (or nobody does).
        mapping.close()
        handle.free()


def lookup(client, name: str, timeout_ms: int, framework: str) -> dict:
    if framework not in ("torch", "numpy"):
        raise ValueError(f"framework is \"torch\" or \"numpy\", not {framework!r}")
    handle = client.lookup(name, timeout_ms)
    try:
        meta = json.loads(bytes(handle.metadata).decode())
        if not isinstance(meta, dict) or meta.get("kind") != KIND:
            raise ValueError(f"{name!r} is not a state dict (publish_state_dict); lookup_tensor or lookup fit it")
        if meta.get("format") != FORMAT:
            raise ValueError(f"{name!r} is a state dict of format {meta.get('format')!r}; this library reads {FORMAT}")
        manifest_bytes = int(meta["manifest_bytes"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        handle.free()
        raise ValueError(f"{name!r}: its metadata is not a state dict's: {e}") from e
    mapping = client.map_handle(handle)
    try:
        if not 0 < manifest_bytes <= mapping.size:
            raise ValueError(f"a manifest of {manifest_bytes} bytes in {mapping.size}")
        manifest = json.loads(bytes(memoryview(mapping)[:manifest_bytes]).decode())
        out = {}
        for entry in manifest["tensors"]:
            key = entry["name"]
            if not isinstance(key, str) or key in out:
                raise ValueError(f"a bad or repeated name {key!r}")
            shape = [int(s) for s in entry["shape"]]
            if any(s < 0 for s in shape):
                raise ValueError(f"{key!r} has a negative dimension")
            offset = int(entry["offset"])
            if offset < manifest_bytes:
                raise ValueError(f"{key!r} overlaps the manifest")
            t = Tensor(handle, mapping, entry["dtype"], shape, None, offset)  # checks that it fits
            out[key] = t.torch() if framework == "torch" else t.numpy()
        return out
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as e:
        raise ValueError(f"{name!r} is a damaged state dict: {e}") from e
    finally:
        # The views hold the mapping (and it the memory); no new views.
        mapping.close()
