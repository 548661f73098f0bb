"""torch's ``max`` / ``min`` / ``argmax`` / ``argmin`` (and ``maximum`` / ``minimum``), with
torch's overloads:

* ``max(input)``: the largest value; ties share the gradient equally (``ops_reduce.max``);
* ``max(input, dim, keepdim=False)``: ``(values, indices)`` with ``.values`` / ``.indices``,
  the first index of each maximum (NaN counts as the maximum), the gradient to those places;
* ``max(input, other)``: the elementwise maximum; where the two are equal each gets half the
  gradient, as torch's ``maximum``.

The framework's own NumPy spelling, ``max(axis=..., keepdims=...)``, still returns the values
alone (``ops_reduce``), so code written for it keeps working.
"""
from __future__ import annotations

import builtins
from collections import namedtuple
from typing import Any

import numpy as np

from ..backends import xp_of
from . import ops_reduce
from .broadcast import unbroadcast
from .tensor import Tensor, _constant, make_result

# torch returns these as torch.return_types.max / min: tuples with named fields
MaxResult = namedtuple("max", ["values", "indices"])
MinResult = namedtuple("min", ["values", "indices"])
_UNSET = object()  # tells "not passed" from None, which torch's dim also takes


def reduction_axis(input: Tensor, dim: Any, op: str) -> int:
    """``dim`` as a non-negative axis of ``input`` (a 0-d tensor has one, as in torch)."""
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)):
        raise TypeError(f"{op}() received an invalid combination of arguments: dim must be an "
                        f"int, got {type(dim).__name__} {dim!r}")
    bound = builtins.max(input.array.ndim, 1)  # this module's `max` is torch's
    if not -bound <= dim < bound:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-bound}, "
                         f"{bound - 1}], but got {dim})")
    return int(dim) % bound


def _nonempty_along(data: Any, axis: int, op: str) -> None:
    if data.shape[axis] == 0:
        raise IndexError(f"{op}(): Expected reduction dim {axis} to have non-zero size.")


def _along_dim(input: Tensor, dim: Any, keepdim: bool, largest: bool) -> tuple:
    op = "max" if largest else "min"
    axis = reduction_axis(input, dim, op)
    data = input.array if input.array.ndim else input.array.reshape(1)
    xp = xp_of(data)
    _nonempty_along(data, axis, op)
    picked = (xp.argmax if largest else xp.argmin)(data, axis=axis, keepdims=True)
    values = xp.take_along_axis(data, picked, axis=axis)
    shape, input_shape = values.shape, input.array.shape
    keep = keepdim and input.array.ndim > 0
    out_shape = shape if keep else shape[:axis] + shape[axis + 1:]

    def backward(g: Any) -> tuple:
        grad = xp.zeros(data.shape, dtype=g.dtype)
        xp.put_along_axis(grad, picked, g.reshape(shape), axis=axis)
        return (grad.reshape(input_shape),)

    result = make_result(values.reshape(out_shape), (input,), backward)
    indices = _constant(picked.reshape(out_shape).astype(np.int64, copy=False))
    return (MaxResult if largest else MinResult)(result, indices)


def _promoted(a: Any, b: Any) -> Any:
    """torch's result dtype for two tensors: the higher kind wins (bool < integer < floating);
    within a kind a tensor with dimensions wins over a 0-d one, else the wider dtype."""
    rank = {"b": 0, "u": 1, "i": 1, "f": 2}
    ka, kb = rank.get(a.dtype.kind, 2), rank.get(b.dtype.kind, 2)
    if ka != kb:
        return a.dtype if ka > kb else b.dtype
    if (a.ndim == 0) != (b.ndim == 0):
        return b.dtype if a.ndim == 0 else a.dtype
    return np.result_type(a.dtype, b.dtype)


def _in_dtype_of(grad: Any, array: Any) -> Any:
    """A floating input's gradient in its own dtype (float32 against float64 gets float32)."""
    return grad.astype(array.dtype, copy=False) if array.dtype.kind == "f" else grad


def _elementwise(input: Tensor, other: Any, largest: bool) -> Tensor:
    op = "maximum" if largest else "minimum"
    if not isinstance(other, Tensor):
        raise TypeError(f"{op}(): other must be a Tensor, got {type(other).__name__}")
    a, b = input.array, other.array
    xp = xp_of(a)
    dtype = _promoted(a, b)
    try:
        out = (xp.maximum if largest else xp.minimum)(a.astype(dtype, copy=False),
                                                     b.astype(dtype, copy=False))
    except ValueError:
        raise ValueError(f"{op}: cannot broadcast shapes {tuple(a.shape)} and "
                         f"{tuple(b.shape)}") from None

    def backward(g: Any) -> tuple:
        # torch: where(a == b, g / 2, g), zero where the other side is the extreme
        tied = a == b
        shared = xp.where(tied, g / 2, g)
        a_loses = (a < b) if largest else (a > b)
        b_loses = (a > b) if largest else (a < b)
        return (_in_dtype_of(unbroadcast(xp.where(a_loses, 0, shared), a.shape), a),
                _in_dtype_of(unbroadcast(xp.where(b_loses, 0, shared), b.shape), b))

    return make_result(out, (input, other), backward)


def maximum(input: Tensor, other: Tensor) -> Tensor:
    """The elementwise maximum (NaN wins); ties give each side half the gradient."""
    return _elementwise(input, other, True)


def minimum(input: Tensor, other: Tensor) -> Tensor:
    """The elementwise minimum (NaN wins); ties give each side half the gradient."""
    return _elementwise(input, other, False)


def _extreme(input: Tensor, dim: Any, keepdim: Any, other: Any, axis: Any, keepdims: Any,
             largest: bool) -> Any:
    op = "max" if largest else "min"
    if axis is not _UNSET or (keepdims is not _UNSET and dim is _UNSET):
        if dim is not _UNSET or other is not None or keepdim is not _UNSET:
            raise TypeError(f"{op}(): pass the NumPy spelling (axis=, keepdims=) or torch's "
                            f"(dim, keepdim, other), not both")
        reduce = ops_reduce.max if largest else ops_reduce.min
        return reduce(input, None if axis is _UNSET else axis,
                      False if keepdims is _UNSET else bool(keepdims))
    if keepdims is not _UNSET:  # torch takes keepdims= as another name of keepdim=
        keepdim = keepdims
    if isinstance(dim, Tensor) and other is None:
        dim, other = _UNSET, dim
    if other is not None:
        if dim is not _UNSET or keepdim is not _UNSET:
            raise TypeError(f"{op}() received an invalid combination of arguments: other "
                            f"with dim or keepdim")
        return _elementwise(input, other, largest)
    if dim is _UNSET or dim is None:
        if keepdim is not _UNSET:
            raise TypeError(f"{op}() received an invalid combination of arguments: keepdim "
                            f"without dim")
        if input.array.size == 0:
            raise RuntimeError(f"{op}(): Expected reduction dim to be specified for "
                               f"input.numel() == 0. Specify the reduction dim with the 'dim' "
                               f"argument.")
        return (ops_reduce.max if largest else ops_reduce.min)(input)
    if not isinstance(keepdim, bool) and keepdim is not _UNSET:
        raise TypeError(f"{op}() received an invalid combination of arguments: keepdim must "
                        f"be a bool, got {type(keepdim).__name__}")
    return _along_dim(input, dim, keepdim is True, largest)


def max(input: Tensor, dim: Any = _UNSET, keepdim: Any = _UNSET, *, other: Any = None,
        axis: Any = _UNSET, keepdims: Any = _UNSET) -> Any:
    """``max(input)``, ``max(input, dim, keepdim=False)`` -> ``(values, indices)``,
    ``max(input, other)``; ``axis=`` / ``keepdims=``: the values alone (NumPy's spelling)."""
    return _extreme(input, dim, keepdim, other, axis, keepdims, True)


def min(input: Tensor, dim: Any = _UNSET, keepdim: Any = _UNSET, *, other: Any = None,
        axis: Any = _UNSET, keepdims: Any = _UNSET) -> Any:
    """As ``max``, for the smallest values."""
    return _extreme(input, dim, keepdim, other, axis, keepdims, False)


def _arg_extreme(input: Tensor, dim: Any, keepdim: bool, largest: bool) -> Tensor:
    op = "argmax" if largest else "argmin"
    data = input.array
    if data.dtype.kind == "b":
        raise RuntimeError(f"{op}(): does not support bool input")
    xp = xp_of(data)
    pick = xp.argmax if largest else xp.argmin
    if dim is None:
        if data.size == 0:
            raise RuntimeError(f"{op}(): Expected reduction dim to be specified for "
                               f"input.numel() == 0.")
        out = pick(data.reshape(-1), axis=0)
        if keepdim:
            out = out.reshape((1,) * data.ndim)
        return _constant(xp.asarray(out, dtype=np.int64))
    axis = reduction_axis(input, dim, op)
    flat = data if data.ndim else data.reshape(1)
    _nonempty_along(flat, axis, op)
    out = pick(flat, axis=axis, keepdims=bool(keepdim) and data.ndim > 0)
    return _constant(xp.asarray(out.reshape(out.shape if data.ndim else ()), dtype=np.int64))


def argmax(input: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Any = _UNSET,
           keepdims: Any = _UNSET) -> Tensor:
    """The index of the (first) largest value, of the flattened tensor when ``dim`` is None;
    int64, no gradient. ``axis`` / ``keepdims`` are other names of ``dim`` / ``keepdim``."""
    return _arg_extreme(input, dim if axis is _UNSET else axis,
                        keepdim if keepdims is _UNSET else bool(keepdims), True)


def argmin(input: Tensor, dim: Any = None, keepdim: bool = False, *, axis: Any = _UNSET,
           keepdims: Any = _UNSET) -> Tensor:
    """As ``argmax``, for the smallest value."""
    return _arg_extreme(input, dim if axis is _UNSET else axis,
                        keepdim if keepdims is _UNSET else bool(keepdims), False)


__all__ = ["MaxResult", "MinResult", "argmax", "argmin", "max", "maximum", "min", "minimum",
           "reduction_axis"]
