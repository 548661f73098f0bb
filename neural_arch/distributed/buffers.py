"""From user tensors to the flat contiguous NumPy buffers the algorithms work on, and back."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .reduce_ops import SUPPORTED_DTYPES, ReduceOp, check_dtype_for_op

_SUPPORTED_NAMES = [np.dtype(d).name for d in SUPPORTED_DTYPES]


def array_of(tensor: Any, what: str = "tensor") -> np.ndarray:
    """The NumPy array behind a ``Tensor`` (its ``.data``) or an array; TypeError otherwise."""
    data = tensor if isinstance(tensor, np.ndarray) else getattr(tensor, "data", None)
    if not isinstance(data, np.ndarray):
        inner = "" if data is None else f" holding {type(data).__module__}.{type(data).__name__}"
        raise TypeError(f"{what} must be a NumPy array or a Tensor holding one, got "
                        f"{type(tensor).__name__}{inner}")
    return data


def checked_array(tensor: Any, what: str = "tensor", op: Optional[ReduceOp] = None,
                  writable: bool = False) -> np.ndarray:
    """``array_of`` plus the dtype (and reduce-op) checks every public collective makes."""
    arr = array_of(tensor, what)
    if arr.dtype.type not in SUPPORTED_DTYPES:
        raise TypeError(f"{what} has dtype {arr.dtype}, which collectives do not support; use "
                        f"one of {_SUPPORTED_NAMES}")
    if op is not None:
        check_dtype_for_op(arr.dtype, op)
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} (shape {arr.shape}, dtype {arr.dtype}) is read-only but the "
                         "collective writes into it")
    return arr


def same_layout(arr: np.ndarray, ref: np.ndarray, what: str) -> None:
    if arr.dtype != ref.dtype:
        raise TypeError(f"{what} has dtype {arr.dtype} but the input tensor has {ref.dtype}")
    if arr.size != ref.size:
        raise ValueError(f"{what} has shape {arr.shape} ({arr.size} elements) but the input "
                         f"tensor has shape {ref.shape} ({ref.size} elements)")


class Flat:
    """A 1-D C-contiguous view of ``arr``; a staged copy when ``arr`` is not contiguous.

    After writing into ``.buf``, call ``commit()`` to copy a staged buffer back into ``arr``.
    """

    __slots__ = ("arr", "buf", "staged")

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr
        self.staged = not arr.flags.c_contiguous
        self.buf = (np.ascontiguousarray(arr) if self.staged else arr).reshape(-1)

    def commit(self) -> None:
        if self.staged:
            self.arr[...] = self.buf.reshape(self.arr.shape)


def wrap_like(template: Any, arr: np.ndarray) -> Any:
    """``arr`` as the same kind of object as ``template`` (array, or Tensor-like)."""
    if isinstance(template, np.ndarray):
        return arr
    return type(template)(arr)


def as_list(items: Any, what: str) -> list:
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{what} must be a list of tensors, got {type(items).__name__}")
    return list(items)
