"""``device``: torch's device object, a ``"cpu"`` / ``"cuda:N"`` string with ``type`` and ``index``.

It is a ``str`` subclass so that every place that takes a device string (``Tensor.to``, the
factories, ``backends.device_type``) takes it unchanged, and so that ``t.device`` (a plain
string here) compares equal to ``device("cpu")``; unlike torch's, it also equals its string.
"""
from __future__ import annotations

from typing import Any, Optional

_KINDS = ("cpu", "cuda")


def _parse(spec: Any, index: Optional[int]) -> tuple:
    if isinstance(spec, device):
        if index is not None:
            raise ValueError(f"device({spec!r}, {index}): a device object takes no index")
        return spec.type, spec.index
    if isinstance(spec, int) and not isinstance(spec, bool):  # torch: device(0) is cuda:0
        spec, index = "cuda", spec if index is None else index
    if not isinstance(spec, str):
        raise TypeError(f"device() expects a string, an int or a device, got "
                        f"{type(spec).__name__}")
    kind, _, number = spec.strip().lower().partition(":")
    if kind not in _KINDS:
        raise RuntimeError(f"expected one of {_KINDS} device type at start of device string: "
                           f"{spec!r}")
    if number:
        if index is not None:
            raise RuntimeError(f"device string {spec!r} already has an index; got index={index}")
        if not number.isdigit():
            raise RuntimeError(f"invalid device string: {spec!r}")
        index = int(number)
    if index is not None:
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise RuntimeError(f"device index must be a non-negative int, got {index!r}")
        if kind == "cpu" and index != 0:
            raise RuntimeError(f"cpu device index must be 0 or absent, got {index}")
    return kind, index


class device(str):
    """``device("cuda:1")``, ``device("cuda", 1)``, ``device("cpu")``, ``device(0)``."""

    def __new__(cls, spec: Any, index: Optional[int] = None) -> "device":
        kind, number = _parse(spec, index)
        self = super().__new__(cls, kind if number is None else f"{kind}:{number}")
        self.type, self.index = kind, number
        return self

    def __repr__(self) -> str:
        if self.index is None:
            return f"device(type='{self.type}')"
        return f"device(type='{self.type}', index={self.index})"

    def __reduce__(self) -> tuple:
        return (device, (self.type, self.index))

    __hash__ = str.__hash__
