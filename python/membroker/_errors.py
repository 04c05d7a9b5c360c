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


# (code, class name) from the library's one list of codes (membroker/status.h).
_CODES = [(code, py_name) for code, _wire, py_name in _membroker.error_codes()]

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
