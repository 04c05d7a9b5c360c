"""membroker.Error and one subclass per wire error code (schemas/membroker.fbs)."""
from __future__ import annotations

from . import _membroker


class Error(Exception):
    """A membroker call failed. .code is the wire error code, .code_name its
    name (e.g. "TIMEOUT"), .message the broker's or the library's reason."""

    code: int = -1
    code_name: str = "UNKNOWN"

    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
            self.code_name = _membroker.error_code_name(code)

    def __str__(self) -> str:
        return f"{self.code_name}: {self.message}"


# (code, class name) - the codes never change, only new ones are appended.
_CODES = [
    (1, "ParamInvalid"), (2, "InvalidHandle"), (3, "NotFound"), (4, "PermissionDenied"),
    (5, "ResourceExhausted"), (6, "ProtocolError"), (7, "VersionMismatch"), (8, "AlreadyExists"),
    (9, "Timeout"), (10, "NotConnected"), (11, "AlreadyConnected"), (12, "Unsupported"),
    (13, "Internal"), (14, "Busy"), (15, "NotMapped"), (16, "Overlap"), (17, "OutOfRange"),
    (18, "QuotaExceeded"), (19, "AddressInUse"),
]

CLASSES: dict[int, type] = {}
for _code, _name in _CODES:
    _cls = type(_name, (Error,), {"code": _code, "code_name": _membroker.error_code_name(_code),
                                  "__doc__": f"{_membroker.error_code_name(_code)} (wire code {_code})."})
    CLASSES[_code] = _cls
    globals()[_name] = _cls

__all__ = ["Error", "error_class"] + [n for _, n in _CODES]


def error_class(code: int) -> type:
    """The Error subclass for a wire error code (Error itself for unknown codes)."""
    return CLASSES.get(code, Error)


_membroker._set_error_classes(dict(CLASSES))
