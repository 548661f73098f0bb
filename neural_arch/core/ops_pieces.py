"""Cutting a tensor into pieces and tiling it, with torch's semantics: ``split``, ``chunk``,
``unbind``, ``repeat``, and ``contiguous``. Every piece is a differentiable view (a slice)."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ..backends import xp_of
from .ops_shape import getitem
from .tensor import Tensor, make_result


def _axis(x: Tensor, dim: Any, op: str) -> int:
    ndim = max(x.array.ndim, 1)
    if isinstance(dim, bool) or not isinstance(dim, (int, np.integer)) or not -ndim <= dim < ndim:
        raise IndexError(f"{op}: dim {dim!r} is out of range for a tensor of shape "
                         f"{tuple(x.array.shape)}")
    return int(dim) % ndim


def _piece(x: Tensor, axis: int, lo: int, hi: int) -> Tensor:
    return getitem(x, (slice(None),) * axis + (slice(lo, hi),))


def split(tensor: Tensor, split_size_or_sections: Any, dim: int = 0) -> Tuple[Tensor, ...]:
    """Pieces of ``split_size_or_sections`` elements along ``dim`` (the last may be smaller),
    or of the listed sizes, which must add up to the dimension's size."""
    axis = _axis(tensor, dim, "split")
    total = tensor.array.shape[axis]
    if isinstance(split_size_or_sections, (list, tuple)):
        sizes = [int(n) for n in split_size_or_sections]
        if sum(sizes) != total or any(n < 0 for n in sizes):
            raise RuntimeError(f"split_with_sizes expects split_sizes to sum exactly to {total} "
                               f"(input tensor's size at dimension {axis}), but got "
                               f"split_sizes={sizes}")
    else:
        step = int(split_size_or_sections)
        if step <= 0 and total:
            raise RuntimeError(f"split expects split_size be positive, got {step}")
        sizes = [min(step, total - lo) for lo in range(0, total, step)] if total else [0]
    pieces, lo = [], 0
    for n in sizes:
        pieces.append(_piece(tensor, axis, lo, lo + n))
        lo += n
    return tuple(pieces)


def chunk(input: Tensor, chunks: int, dim: int = 0) -> Tuple[Tensor, ...]:
    """At most ``chunks`` pieces of ``ceil(size / chunks)`` elements along ``dim``."""
    if isinstance(chunks, bool) or int(chunks) <= 0:
        raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    total = input.array.shape[_axis(input, dim, "chunk")]
    return split(input, max(-(-total // int(chunks)), 1), dim)


def unbind(input: Tensor, dim: int = 0) -> Tuple[Tensor, ...]:
    """The slices along ``dim``, each without that dimension."""
    axis = _axis(input, dim, "unbind")
    prefix = (slice(None),) * axis
    return tuple(getitem(input, prefix + (i,)) for i in range(input.array.shape[axis]))


def repeat(input: Tensor, *sizes: Any) -> Tensor:
    """Tile ``input`` ``sizes[i]`` times along dimension ``i`` (torch's ``Tensor.repeat``;
    extra leading sizes add dimensions). The gradient sums over the copies."""
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    times = tuple(int(n) for n in sizes)
    xd = input.array
    if len(times) < xd.ndim:
        raise RuntimeError(f"Number of dimensions of repeat dims ({len(times)}) can not be "
                           f"smaller than number of dimensions of tensor ({xd.ndim}, shape "
                           f"{tuple(xd.shape)})")
    if any(n < 0 for n in times):
        raise RuntimeError(f"repeat sizes must be non-negative, got {times}")
    shape = (1,) * (len(times) - xd.ndim) + tuple(xd.shape)
    out = xp_of(xd).tile(xd.reshape(shape), times)
    in_shape = xd.shape
    # view the gradient as (times0, size0, times1, size1, ...) and add up the copies
    split_shape = tuple(v for pair in zip(times, shape) for v in pair)

    def backward(g: Any) -> tuple:
        copies = tuple(range(0, 2 * len(times), 2))
        return (g.reshape(split_shape).sum(axis=copies).reshape(in_shape),)

    return make_result(out, (input,), backward)


def contiguous(input: Tensor) -> Tensor:
    """``input`` itself when its data is C-contiguous, else a contiguous copy in the graph."""
    xd = input.array
    if xd.flags.c_contiguous:
        return input
    return make_result(xp_of(xd).ascontiguousarray(xd), (input,), lambda g: (g,))
