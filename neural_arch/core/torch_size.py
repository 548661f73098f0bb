"""``Size``: torch's shape tuple (``torch.Size``), what ``Tensor.size()`` returns.

A ``tuple`` subclass, so it equals, unpacks and indexes like the plain tuple ``Tensor.shape``
gives; slicing and concatenation keep the type, as in torch.
"""
from __future__ import annotations

from typing import Any


class Size(tuple):
    """``Size([2, 3])``: a tuple of ints with ``numel()``."""

    def __new__(cls, sizes: Any = ()) -> "Size":
        return super().__new__(cls, (int(n) for n in sizes))

    def numel(self) -> int:
        """The number of elements a tensor of this shape holds."""
        count = 1
        for n in self:
            count *= n
        return count

    def __getitem__(self, index: Any) -> Any:
        picked = super().__getitem__(index)
        return Size(picked) if isinstance(index, slice) else picked

    def __add__(self, other: Any) -> "Size":
        return Size(tuple(self) + tuple(other))

    def __radd__(self, other: Any) -> "Size":
        return Size(tuple(other) + tuple(self))

    def __mul__(self, times: Any) -> "Size":
        return Size(tuple(self) * times)

    __rmul__ = __mul__

    def __repr__(self) -> str:
        return f"Size({list(self)})"

    __str__ = __repr__

    def __reduce__(self) -> tuple:
        return (Size, (tuple(self),))
