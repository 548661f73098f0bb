"""Index-driven reads and writes along one dimension, with torch's semantics: ``gather``,
``scatter`` and ``scatter_add`` (out-of-place, differentiable in ``input`` and ``src``).

``index`` has as many dimensions as ``input``; along every other dimension it may be shorter
than ``input`` (and than ``src``), and only that leading block takes part, as in torch.
Where ``scatter`` writes one place twice, the last write wins (torch leaves it unspecified).
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ..backends import xp_of
from .ops_shape import index_add
from .tensor import Tensor, make_result


def _axis(x: Any, dim: Any, op: str) -> int:
    ndim = max(x.ndim, 1)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim {dim!r} is out of range for a tensor of shape "
                         f"{tuple(x.shape)}")
    return int(dim) % ndim


def _checked_index(x: Any, axis: int, index: Any, op: str, other: Any = None) -> Any:
    idx = index.array if isinstance(index, Tensor) else np.asarray(index)
    if idx.dtype.kind not in "iu":
        raise RuntimeError(f"{op}: index must be an integer tensor, got dtype {idx.dtype}")
    if idx.ndim != x.ndim:
        raise RuntimeError(f"{op}: index has {idx.ndim} dimensions (shape {tuple(idx.shape)}) "
                           f"but input has {x.ndim} (shape {tuple(x.shape)})")
    if any(n > m for d, (n, m) in enumerate(zip(idx.shape, x.shape)) if d != axis):
        raise RuntimeError(f"{op}: index shape {tuple(idx.shape)} is larger than input shape "
                           f"{tuple(x.shape)} outside dimension {axis}")
    if other is not None and any(n > m for n, m in zip(idx.shape, other.shape)):
        raise RuntimeError(f"{op}: index shape {tuple(idx.shape)} is larger than src shape "
                           f"{tuple(other.shape)}")
    if idx.size:
        lowest, highest = int(idx.min()), int(idx.max())
        if lowest < 0 or highest >= x.shape[axis]:
            bad = lowest if lowest < 0 else highest
            raise RuntimeError(f"{op}: index {bad} is out of bounds for dimension {axis} with "
                               f"size {x.shape[axis]}")
    return idx


def _places(idx: Any, axis: int) -> Tuple[Any, ...]:
    """A NumPy index that names, for each element of ``idx``, the place it points at."""
    xp = xp_of(idx)
    ndim = idx.ndim
    return tuple(idx if d == axis else
                 xp.arange(n).reshape(tuple(-1 if k == d else 1 for k in range(ndim)))
                 for d, n in enumerate(idx.shape))


def _block(shape: Tuple[int, ...]) -> Tuple[slice, ...]:
    return tuple(slice(0, n) for n in shape)


def gather(input: Tensor, dim: int, index: Any) -> Tensor:
    """``out[i][j] = input[index[i][j]][j]`` for ``dim=0`` (and likewise for other dims);
    ``out`` has ``index``'s shape. Repeated indices add their gradients."""
    xd = input.array
    axis = _axis(xd, dim, "gather")
    idx = _checked_index(xd, axis, index, "gather")
    places = _places(idx, axis)
    shape = xd.shape

    def backward(g: Any) -> tuple:
        grad = xp_of(g).zeros(shape, dtype=g.dtype)
        index_add(xp_of(g), grad, places, g)
        return (grad,)

    return make_result(xd[places], (input,), backward)


def _source(input: Tensor, src: Any, op: str) -> Tuple[Any, Any]:
    """(src array, src Tensor or None); a number becomes a filled block (torch's ``value``)."""
    if isinstance(src, Tensor):
        if src.array.dtype != input.array.dtype:
            raise RuntimeError(f"{op}: expected src to have dtype {input.array.dtype} like the "
                               f"input, got {src.array.dtype}")
        if src.array.ndim != input.array.ndim:
            raise RuntimeError(f"{op}: src has {src.array.ndim} dimensions (shape "
                               f"{tuple(src.array.shape)}) but input has {input.array.ndim}")
        return src.array, src
    return xp_of(input.array).asarray(src, dtype=input.array.dtype), None


def _scatter(input: Tensor, dim: int, index: Any, src: Any, op: str, accumulate: bool
             ) -> Tensor:
    xd = input.array
    axis = _axis(xd, dim, op)
    srcd, src_tensor = _source(input, src, op)
    idx = _checked_index(xd, axis, index, op, srcd if srcd.ndim else None)
    places = _places(idx, axis)
    values = srcd[_block(idx.shape)] if srcd.ndim else srcd
    out = xd.copy()
    xp = xp_of(xd)
    if accumulate:
        index_add(xp, out, places, xp.broadcast_to(values, idx.shape))
    else:
        out[places] = values
    src_shape = srcd.shape
    parents = (input,) if src_tensor is None else (input, src_tensor)

    def backward(g: Any) -> tuple:
        grad_input = None
        if input.requires_grad:
            grad_input = g
            if not accumulate:
                grad_input = g.copy()
                grad_input[places] = 0  # overwritten places did not come from input
        grads = [grad_input]
        if src_tensor is not None:
            grad_src = None
            if src_tensor.requires_grad:
                grad_src = xp_of(g).zeros(src_shape, dtype=g.dtype)
                grad_src[_block(idx.shape)] = g[places]
            grads.append(grad_src)
        return tuple(grads)

    return make_result(out, parents, backward)


def scatter(input: Tensor, dim: int, index: Any, src: Any = None, *, value: Any = None
            ) -> Tensor:
    """A copy of ``input`` with ``src`` (a tensor, or a number ``value``) written at ``index``
    along ``dim``: ``out[index[i][j]][j] = src[i][j]`` for ``dim=0``."""
    if (src is None) == (value is None):
        raise TypeError("scatter() takes either src or value")
    return _scatter(input, dim, index, value if src is None else src, "scatter",
                    accumulate=False)


def scatter_add(input: Tensor, dim: int, index: Any, src: Any) -> Tensor:
    """A copy of ``input`` with ``src`` added at ``index`` along ``dim`` (repeats add up)."""
    return _scatter(input, dim, index, src, "scatter_add", accumulate=True)
