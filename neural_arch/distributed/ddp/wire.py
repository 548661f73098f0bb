"""A bucket whose flat array holds a narrower dtype than its parameters (the wire), and the
copies that cast on the way in and out.

A bucket normally holds its parameters' dtype: packing copies each gradient in, unpacking
copies the average out. Under a hook that averages a float16 copy of the bucket
(``comm_hooks.fp16_compress_hook``) the bucket is that copy instead: packing rounds each
gradient to float16 while copying it, and unpacking widens the average while copying it out.
The casts then cost no passes of their own (cast a float32 bucket, average, cast back: two
passes over the bucket beside the copies), and the float32 bucket is not kept at all.

The bits are those of the hook on a bucket of the parameters' dtype: a gradient of another
dtype is first rounded to the parameters' dtype, as copying it into such a bucket would, each
element then rounds once to float16 (ties to even, as NumPy's cast), and widening is exact.
The float32 <-> float16 casts run compiled (``reductions.kernels``); NumPy converts float16
one element at a time.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ..buffers import copy_from_host, copy_into_host
from ..reductions.kernels import to_float16, to_float32


def narrower_wire(dtype: np.dtype, wire: Optional[np.dtype]) -> Optional[np.dtype]:
    """``wire`` when a bucket of ``dtype`` parameters can be packed in it (a floating dtype
    wider than the wire); None when the bucket keeps its own dtype."""
    dtype = np.dtype(dtype)
    if wire is None or dtype.kind != "f" or dtype.itemsize <= np.dtype(wire).itemsize:
        return None
    return np.dtype(wire)


def pack_gradient(view: np.ndarray, grad: Any, dtype: np.dtype) -> None:
    """Copy ``grad`` (NumPy or CuPy) into ``view``, the slice of a bucket of ``dtype``
    parameters that holds it; cast to the bucket's wire dtype on the way when it has one."""
    if view.dtype == dtype:
        copy_into_host(view, grad)
        return
    if type(grad) is not np.ndarray or grad.dtype != dtype:
        staged = np.empty(view.size, dtype)  # on the host, rounded as a plain bucket would
        copy_into_host(staged, grad)
        grad = staged
    to_float16(grad.reshape(-1), view)  # for other than float32 -> float16: NumPy's cast


def unpack_gradient(view: np.ndarray, param: Any, dtype: np.dtype) -> Any:
    """The gradient ``param`` gets from ``view`` (a slice of a bucket whose wire is narrower
    than ``dtype``): widened into the current ``param.grad`` where that is a contiguous host
    array of ``dtype``, else into a new array on the parameter's side (host or GPU)."""
    grad = None if param.grad is None else param.grad.array
    if (type(grad) is np.ndarray and grad.dtype == dtype and grad.flags.c_contiguous
            and grad.size == view.size):
        to_float32(view, grad.reshape(-1))  # other than float16 -> float32: NumPy's cast
        return grad
    widened = to_float32(view, np.empty(view.size, dtype)).reshape(param.array.shape)
    if grad is None and type(param.array) is np.ndarray:
        return widened
    return copy_from_host(widened, param.array, out=grad)
