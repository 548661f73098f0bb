"""Selection by value or position, with torch's signatures: ``sort``, ``argsort``, ``topk``,
``where`` (three-argument and one-argument forms), ``tril`` and ``triu``.

Sorting is always stable (ties keep their original order), which is one of the orders torch
allows for ``stable=False`` and the one it guarantees for ``stable=True``. NaN counts as larger
than every number, as in torch: last ascending, first descending.
"""
from __future__ import annotations

from collections import namedtuple
from typing import Any, Tuple

import numpy as np

from ..backends import xp_of
from . import ops_shape
from .tensor import Tensor, _constant, make_result

# torch returns these as torch.return_types.sort / topk: tuples with named fields
SortResult = namedtuple("sort", ["values", "indices"])
TopKResult = namedtuple("topk", ["values", "indices"])


def _axis(x: Tensor, dim: int, op: str) -> int:
    ndim = max(x.array.ndim, 1)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim {dim!r} is out of range for a tensor of shape "
                         f"{tuple(x.array.shape)}")
    return int(dim) % ndim


def _order(data: Any, axis: int, descending: bool) -> Any:
    """Stable argsort along ``axis``; descending keeps equal values in their original order."""
    xp = xp_of(data)
    if not descending:
        return xp.argsort(data, axis=axis, kind="stable")
    # Sorting the reversed array ascending and reversing the result gives descending order
    # with ties by increasing index, NaN first, and works for unsigned and bool data too.
    order = xp.argsort(xp.flip(data, axis=axis), axis=axis, kind="stable")
    return (data.shape[axis] - 1) - xp.flip(order, axis=axis)


def _gathered(x: Tensor, indices: Any, axis: int) -> Tensor:
    """``x``'s values at ``indices`` along ``axis``; the gradient goes back to those places."""
    xd = x.array
    xp = xp_of(xd)
    values = xp.take_along_axis(xd, indices, axis=axis)
    shape = xd.shape

    def backward(g: Any) -> tuple:
        grad = xp.zeros(shape, dtype=g.dtype)
        xp.put_along_axis(grad, indices, g, axis=axis)  # indices along axis are distinct
        return (grad,)

    return make_result(values, (x,), backward)


def _as_1d(x: Tensor) -> Tuple[Tensor, bool]:
    """Torch treats a 0-d tensor as one element along dim 0 or -1."""
    return (ops_shape.reshape(x, (1,)), True) if x.array.ndim == 0 else (x, False)


def sort(input: Tensor, dim: int = -1, descending: bool = False, *, stable: bool = False
         ) -> SortResult:
    """``(values, indices)`` of ``input`` sorted along ``dim``; ``values`` is differentiable."""
    x, scalar = _as_1d(input)
    axis = _axis(x, dim, "sort")
    indices = _order(x.array, axis, descending).astype(np.int64)
    values = _gathered(x, indices, axis)
    if scalar:
        return SortResult(ops_shape.reshape(values, ()), _constant(indices.reshape(())))
    return SortResult(values, _constant(indices))


def argsort(input: Tensor, dim: int = -1, descending: bool = False, *, stable: bool = False
            ) -> Tensor:
    """The int64 indices that sort ``input`` along ``dim``."""
    return sort(input, dim, descending, stable=stable).indices


def topk(input: Tensor, k: int, dim: int = -1, largest: bool = True, sorted: bool = True
         ) -> TopKResult:
    """The ``k`` largest (or smallest) elements along ``dim`` as ``(values, indices)``;
    among equal values the lower index comes first. Always returned sorted."""
    x, scalar = _as_1d(input)
    axis = _axis(x, dim, "topk")
    size = x.array.shape[axis]
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= size:
        raise RuntimeError(f"topk: k={k!r} is out of range for dimension {dim} of size {size} "
                           f"(shape {tuple(input.array.shape)})")
    order = _order(x.array, axis, descending=largest)
    picked = [slice(None)] * x.array.ndim
    picked[axis] = slice(0, int(k))
    indices = order[tuple(picked)].astype(np.int64)
    values = _gathered(x, indices, axis)
    if scalar and k == 1:
        return TopKResult(ops_shape.reshape(values, ()), _constant(indices.reshape(())))
    return TopKResult(values, _constant(indices))


def where(condition: Any, input: Any = None, other: Any = None) -> Any:
    """``where(condition, input, other)``: ``input`` where ``condition`` holds, else ``other``
    (broadcast, differentiable in both). ``where(condition)``: a tuple of int64 index tensors,
    one per dimension, of the non-zero elements (``nonzero(as_tuple=True)``)."""
    if input is None and other is None:
        cond = condition.array if isinstance(condition, Tensor) else np.asarray(condition)
        return tuple(_constant(i.astype(np.int64)) for i in xp_of(cond).nonzero(cond))
    if input is None or other is None:
        raise TypeError("where() takes either (condition) or (condition, input, other)")
    return ops_shape.where(condition, input, other)


def _triangle(input: Tensor, diagonal: int, op: str, keep_lower: bool) -> Tensor:
    xd = input.array
    if xd.ndim < 2:
        raise RuntimeError(f"{op}: input tensor must have at least 2 dimensions, got shape "
                           f"{tuple(xd.shape)}")
    xp = xp_of(xd)
    cut = xp.tril if keep_lower else xp.triu
    k = int(diagonal)
    return make_result(cut(xd, k), (input,), lambda g: (cut(g, k),))


def tril(input: Tensor, diagonal: int = 0) -> Tensor:
    """The lower triangle of the last two dimensions (``diagonal`` > 0 keeps more above it)."""
    return _triangle(input, diagonal, "tril", keep_lower=True)


def triu(input: Tensor, diagonal: int = 0) -> Tensor:
    """The upper triangle of the last two dimensions (``diagonal`` > 0 drops more of it)."""
    return _triangle(input, diagonal, "triu", keep_lower=False)
