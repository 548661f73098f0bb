"""Reductions: sum, mean, max, min, var, std, argmax, argmin (``axis`` or PyTorch's ``dim``)."""
from __future__ import annotations

import builtins
from typing import Any, Optional, Tuple, Union

from ..backends import xp_of
from .bfloat16 import accumulate_dtype
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node

Axis = Union[None, int, Tuple[int, ...]]


def normalize_axes(axis: Axis, ndim: int) -> Optional[Tuple[int, ...]]:
    """``axis`` as a sorted tuple of non-negative ints (None stays None)."""
    if axis is None:
        return None
    axes = (axis,) if not isinstance(axis, (tuple, list)) else tuple(axis)
    normalized = []
    for a in axes:
        a = int(a)
        bound = builtins.max(ndim, 1)
        if not -bound <= a < bound:
            raise ValueError(f"axis {a} is out of range for a tensor with {ndim} dimensions")
        normalized.append(a % bound)
    if len(set(normalized)) != len(normalized):
        raise ValueError(f"repeated axis in {axis}")
    return tuple(sorted(normalized))


def _pick(axis: Axis, dim: Axis) -> Axis:
    if dim is not None:
        if axis is not None:
            raise ValueError(f"pass either axis ({axis}) or dim ({dim}), not both")
        return dim
    return axis


def _restore(g: Any, shape: Tuple[int, ...], axes: Optional[Tuple[int, ...]], keepdims: bool
             ) -> Any:
    """Broadcast a reduced gradient back to the input's shape (a read-only view)."""
    xp = xp_of(g)
    if not keepdims and axes is not None and len(shape) > 0:
        g = xp.expand_dims(g, axes)
    return xp.broadcast_to(g, shape)


def _count(shape: Tuple[int, ...], axes: Optional[Tuple[int, ...]]) -> int:
    count = 1
    for i, n in enumerate(shape):
        if axes is None or i in axes:
            count *= n
    return count


def _accumulated(data: Any, reduction: str, axes: Optional[Tuple[int, ...]],
                 keepdims: bool) -> Any:
    """``data.sum`` or ``data.mean``; bfloat16 accumulates in float32 and rounds once, as
    torch's CPU kernels (bfloat16 partial sums would stall: 256 + 1 rounds to 256)."""
    wide = accumulate_dtype(data.dtype)
    if wide is None:
        return getattr(data, reduction)(axis=axes, keepdims=keepdims)
    return getattr(data, reduction)(axis=axes, keepdims=keepdims, dtype=wide).astype(data.dtype)


def sum(x: Tensor, axis: Axis = None, keepdims: bool = False, dim: Axis = None) -> Tensor:
    axes = normalize_axes(_pick(axis, dim), x.array.ndim)
    out = _accumulated(x.array, "sum", axes, keepdims)
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(out)
    shape = x.array.shape
    return _node(out, (x,), lambda g: (_restore(g, shape, axes, keepdims),))


def mean(x: Tensor, axis: Axis = None, keepdims: bool = False, dim: Axis = None) -> Tensor:
    axes = normalize_axes(_pick(axis, dim), x.array.ndim)
    out = _accumulated(x.array, "mean", axes, keepdims)
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(out)
    shape = x.array.shape
    count = _count(shape, axes)
    return _node(out, (x,), lambda g: (_restore(g / count, shape, axes, keepdims),))


def _extreme(x: Tensor, axis: Axis, keepdims: bool, dim: Axis, largest: bool) -> Tensor:
    xd = x.array
    axes = normalize_axes(_pick(axis, dim), xd.ndim)
    if axes is None:
        axes = tuple(range(xd.ndim))
    kept = xd.max(axis=axes, keepdims=True) if largest else xd.min(axis=axes, keepdims=True)
    out = kept if keepdims else kept.reshape(tuple(n for i, n in enumerate(kept.shape)
                                                   if i not in axes))
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(out)

    def backward(g: Any) -> tuple:
        # Ties share the gradient equally (PyTorch's amax/amin rule).
        g = g if keepdims else g.reshape(kept.shape)
        hit = xd == kept
        return (hit * (g / hit.sum(axis=axes, keepdims=True)),)

    return _node(out, (x,), backward)


def max(x: Tensor, axis: Axis = None, keepdims: bool = False, dim: Axis = None) -> Tensor:
    """Largest value along ``axis`` (values only; use ``argmax`` for indices)."""
    return _extreme(x, axis, keepdims, dim, True)


def min(x: Tensor, axis: Axis = None, keepdims: bool = False, dim: Axis = None) -> Tensor:
    """Smallest value along ``axis`` (values only; use ``argmin`` for indices)."""
    return _extreme(x, axis, keepdims, dim, False)


def var(x: Tensor, axis: Axis = None, keepdims: bool = False, dim: Axis = None,
        correction: Optional[int] = None, unbiased: Optional[bool] = None,
        ddof: Optional[int] = None) -> Tensor:
    """Variance as in PyTorch: unbiased (correction=1) unless ``correction``/``ddof``=0 or
    ``unbiased=False``."""
    given = [v for v in (correction, ddof) if v is not None]
    if len(given) + (unbiased is not None) > 1:
        raise ValueError(f"pass only one of correction={correction}, unbiased={unbiased}, "
                         f"ddof={ddof}")
    if unbiased is not None:
        correction = 1 if unbiased else 0
    elif given:
        correction = given[0]
    else:
        correction = 1
    axes = normalize_axes(_pick(axis, dim), x.array.ndim)
    centered = x - mean(x, axes, keepdims=True)
    total = sum(centered * centered, axes, keepdims=keepdims)
    return total / (_count(x.array.shape, axes) - correction)


def std(x: Tensor, axis: Axis = None, keepdims: bool = False, dim: Axis = None,
        correction: Optional[int] = None, unbiased: Optional[bool] = None,
        ddof: Optional[int] = None) -> Tensor:
    """Standard deviation, the square root of ``var`` (same arguments)."""
    return var(x, axis, keepdims, dim, correction, unbiased, ddof).sqrt()


def argmax(x: Tensor, axis: Optional[int] = None, keepdims: bool = False,
           dim: Optional[int] = None) -> Tensor:
    axis = _pick(axis, dim)
    return _constant(x.array.argmax(axis=axis, keepdims=keepdims))


def argmin(x: Tensor, axis: Optional[int] = None, keepdims: bool = False,
           dim: Optional[int] = None) -> Tensor:
    axis = _pick(axis, dim)
    return _constant(x.array.argmin(axis=axis, keepdims=keepdims))
