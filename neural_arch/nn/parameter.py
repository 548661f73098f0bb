"""``Parameter``: a tensor that a ``Module`` registers as trainable."""
from __future__ import annotations

from typing import Any

from ..core import Tensor


class Parameter(Tensor):
    """A ``Tensor`` with ``requires_grad=True`` by default, registered when set on a Module.

    The array's dtype is kept (float64 parameters stay float64).
    """

    def __init__(self, data: Any, requires_grad: bool = True, name: Any = None) -> None:
        array = data.array if isinstance(data, Tensor) else data
        dtype = getattr(array, "dtype", None)
        super().__init__(array, requires_grad=requires_grad, dtype=dtype, name=name)

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()
