"""Element types of broker tensors, by one canonical name each ("float32",
"bfloat16", "float8_e4m3fn", ...): what travels in a publication's metadata,
whatever the program said (a string, a numpy dtype, a torch dtype). numpy has
no bfloat16, complex32 or float8 types; their tensors are read through torch."""
from __future__ import annotations

from typing import Any, NamedTuple


class DType(NamedTuple):
    name: str        # canonical, as it travels
    itemsize: int
    numpy: str | None  # the numpy dtype's name, where numpy has one
    torch: str | None  # the attribute of the torch module


# Every type numpy or torch has that a tensor may hold (little-endian). The
# float8 types exist in newer torch only; a name whose torch attribute is
# missing still travels, and is refused where torch would be needed.
_TABLE = [DType(n, s, np_name, t) for n, s, np_name, t in [
    ("bool", 1, "bool", "bool"),
    ("uint8", 1, "uint8", "uint8"), ("int8", 1, "int8", "int8"),
    ("uint16", 2, "uint16", "uint16"), ("int16", 2, "int16", "int16"),
    ("uint32", 4, "uint32", "uint32"), ("int32", 4, "int32", "int32"),
    ("uint64", 8, "uint64", "uint64"), ("int64", 8, "int64", "int64"),
    ("float16", 2, "float16", "float16"), ("bfloat16", 2, None, "bfloat16"),
    ("float32", 4, "float32", "float32"), ("float64", 8, "float64", "float64"),
    ("complex32", 4, None, "complex32"), ("complex64", 8, "complex64", "complex64"),
    ("complex128", 16, "complex128", "complex128"),
    ("float8_e4m3fn", 1, None, "float8_e4m3fn"), ("float8_e5m2", 1, None, "float8_e5m2"),
    ("float8_e4m3fnuz", 1, None, "float8_e4m3fnuz"), ("float8_e5m2fnuz", 1, None, "float8_e5m2fnuz"),
]]
_BY_NAME = {d.name: d for d in _TABLE}
# Names numpy does not know. Other strings are numpy's ("float" is float64
# there); a torch dtype object says its canonical name itself (torch.half is
# "torch.float16").
_ALIASES = {"bf16": "bfloat16", "chalf": "complex32", "bool_": "bool"}


def dtype(spec: Any) -> DType:
    """The element type a string, numpy dtype or torch dtype names. ValueError
    for what is none of these (or a big-endian numpy type)."""
    name = None
    if isinstance(spec, DType):
        return spec
    if isinstance(spec, str):
        name = spec[len("torch."):] if spec.startswith("torch.") else spec
    elif type(spec).__module__ == "torch" and type(spec).__name__ == "dtype":
        name = str(spec)[len("torch."):]
    name = _ALIASES.get(name, name)
    if name in _BY_NAME:
        return _BY_NAME[name]
    import numpy as np
    try:
        npd = np.dtype(spec)
    except TypeError as e:
        raise ValueError(f"not an element type: {spec!r}") from e
    if npd.byteorder == ">" and npd.itemsize > 1:
        raise ValueError(f"big-endian {npd} is not a type a tensor holds here; use {npd.newbyteorder('<')}")
    if npd.name not in _BY_NAME:
        raise ValueError(f"numpy's {npd} is not a type a tensor holds (numbers, bool and complex only)")
    return _BY_NAME[npd.name]


def numpy_dtype(d: DType):
    import numpy as np
    if d.numpy is None:
        raise TypeError(f"numpy has no {d.name}: read this tensor with .torch()")
    return np.dtype(d.numpy)


def torch_dtype(d: DType):
    import torch
    t = getattr(torch, d.torch, None) if d.torch else None
    if t is None:
        raise TypeError(f"this torch ({torch.__version__}) has no {d.name}")
    return t


def typestr(d: DType) -> str:
    """The array interface's type string ("<f4", "|u1"), for the types numpy
    has; TypeError for the others, which __cuda_array_interface__ cannot name."""
    if d.numpy is None:
        raise TypeError(f"__cuda_array_interface__ has no type string for {d.name}: use DLPack")
    kind = {"bool": "b", "uint": "u", "int": "i", "float": "f", "complex": "c"}[d.numpy.rstrip("0123456789")]
    return ("|" if d.itemsize == 1 else "<") + kind + str(d.itemsize)
