"""Reduction operators and the in-place NumPy kernels that apply them."""
from __future__ import annotations

from enum import Enum
from typing import Any, Callable, Dict, Optional, Tuple

import numpy as np

from .reductions.kernels import add_halves, divide_halves


class ReduceOp(Enum):
    SUM = "sum"
    PRODUCT = "product"
    MIN = "min"
    MAX = "max"
    AVERAGE = "average"
    AVG = "average"  # alias, as in PyTorch

    # Members are singletons compared by identity, so identity hashing is consistent; Enum's
    # own hash (of the name) showed up in the per-call cost of small collectives.
    __hash__ = object.__hash__


SUPPORTED_DTYPES = (np.float16, np.float32, np.float64, np.int32, np.int64)
# Each op's short name in collective fingerprints ("all_reduce:sum").
OP_CODE = {ReduceOp.SUM: "sum", ReduceOp.PRODUCT: "prod", ReduceOp.MIN: "min",
           ReduceOp.MAX: "max", ReduceOp.AVERAGE: "avg"}

_UFUNC = {
    ReduceOp.SUM: np.add,
    ReduceOp.AVERAGE: np.add,  # summed, then divided once by the world size
    ReduceOp.PRODUCT: np.multiply,
    ReduceOp.MIN: np.minimum,
    ReduceOp.MAX: np.maximum,
}


_AVERAGERS: Dict[tuple, Tuple[np.ufunc, Any]] = {}  # (dtype, count) -> averager()


def as_reduce_op(op) -> ReduceOp:
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, str):
        key = op.upper()
        if key in ReduceOp.__members__:
            return ReduceOp[key]
    raise ValueError(f"unknown reduce op {op!r}; use one of {sorted(ReduceOp.__members__)}")


def ufunc_for(op: ReduceOp) -> np.ufunc:
    return _UFUNC[op]


def reduce_into(acc: np.ndarray, other: np.ndarray, op: ReduceOp) -> None:
    """acc = op(acc, other), elementwise, in place."""
    _UFUNC[op](acc, other, out=acc)


def combiner(op: ReduceOp, dtype: np.dtype) -> Callable[..., Any]:
    """What adds two vectors for ``op`` (called as ``combine(x, y, out=out)``): the ufunc, or
    for a float16 sum the compiled loop with NumPy's bits (``reductions.kernels``), since
    NumPy adds float16 one element at a time."""
    if dtype == np.float16 and _UFUNC[op] is np.add:
        return add_halves
    return _UFUNC[op]


def averager(dtype: np.dtype, count: int) -> Tuple[np.ufunc, Any]:
    """The ufunc and scalar that turn a float sum of ``count`` values into their mean:
    ``np.divide`` by ``count``, or, for a power-of-two ``count``, ``np.multiply`` by its
    reciprocal. Both round the same exact quotient, so the bits are the same, and a
    multiplication is the cheaper instruction."""
    key = (dtype, count)
    found = _AVERAGERS.get(key)
    if found is None:
        dtype = np.dtype(dtype)
        reciprocal = dtype.type(1.0 / count)
        if count & (count - 1) == 0 and float(reciprocal) == 1.0 / count:
            found = (np.multiply, reciprocal)
        else:
            found = (np.divide, dtype.type(count))
        _AVERAGERS[key] = found
    return found


def divide_by_count(values: np.ndarray, count: int, out: Optional[np.ndarray] = None) -> None:
    """``out = values / count`` (in place without ``out``), through ``averager``; float16
    through the compiled loop, with NumPy's bits."""
    if values.dtype == np.float16:
        divide_halves(values, count, values if out is None else out)
        return
    ufunc, scalar = averager(values.dtype, count)
    ufunc(values, scalar, out=values if out is None else out)


def finish_average(buf: np.ndarray, op: ReduceOp, world_size: int) -> None:
    """Divide a SUM by the world size when the op was AVERAGE (float dtypes only)."""
    if op is ReduceOp.AVERAGE and world_size > 1:
        divide_by_count(buf, world_size)


def check_dtype_for_op(dtype: np.dtype, op: ReduceOp) -> None:
    if np.dtype(dtype).type not in SUPPORTED_DTYPES:
        raise TypeError(f"dtype {np.dtype(dtype)} is not supported by collectives; use one of "
                        f"{[np.dtype(d).name for d in SUPPORTED_DTYPES]}")
    if op is ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
        raise TypeError(f"ReduceOp.AVERAGE needs a floating dtype, got {np.dtype(dtype)}; "
                        "use SUM and divide yourself")
