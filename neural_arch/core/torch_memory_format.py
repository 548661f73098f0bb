"""torch's memory formats (``torch.contiguous_format``, ``torch.channels_last``,
``torch.channels_last_3d``, ``torch.preserve_format``) over NumPy strides.

A tensor's array is a NumPy (or CuPy) array, and an array's layout is its strides, so a memory
format here is what it is in torch: the same logical (N, C, H, W) shape with the channels
stored last in memory, an NHWC array viewed back as NCHW. Values never depend on it. Nothing
is computed faster for it either: the convolutions copy their input into an NCHW work buffer
anyway (whatever its strides, bit for bit the same result) and return contiguous outputs, so
the layout does not travel through a convolution as it does in torch (``docs/porting.md``).
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from ..backends import xp_of


class memory_format:  # noqa: N801 - torch's class name
    """One of torch's layout names; compared by identity, printed as torch prints it."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"torch.{self.name}"

    def __reduce__(self) -> Tuple[Any, Tuple[str]]:
        return _by_name, (self.name,)  # unpickles to the same object


contiguous_format = memory_format("contiguous_format")
channels_last = memory_format("channels_last")
channels_last_3d = memory_format("channels_last_3d")
preserve_format = memory_format("preserve_format")

_FORMATS = {f.name: f for f in (contiguous_format, channels_last, channels_last_3d,
                                preserve_format)}
_CHANNELS_LAST_RANK = {channels_last: 4, channels_last_3d: 5}


def _by_name(name: str) -> memory_format:
    return _FORMATS[name]


def checked_format(value: Any, op: str) -> memory_format:
    """``value`` when it is a memory format, else torch's TypeError naming ``op``."""
    if not isinstance(value, memory_format):
        raise TypeError(f"{op}(): argument 'memory_format' must be torch.memory_format, not "
                        f"{type(value).__name__} ({value!r})")
    return value


def check_rank(shape: Tuple[int, ...], fmt: memory_format, op: str) -> None:
    """torch's error when ``fmt`` is a channels-last format of another rank than ``shape``'s."""
    rank = _CHANNELS_LAST_RANK.get(fmt)
    if rank is not None and len(shape) != rank:
        raise RuntimeError(f"required rank {rank} tensor to use {fmt.name} format ({op} got a "
                           f"tensor of shape {tuple(shape)}, rank {len(shape)})")


def _channels_last_order(ndim: int) -> Tuple[int, ...]:
    """The axes of an (N, C, *spatial) array in the order channels-last memory holds them."""
    return (0,) + tuple(range(2, ndim)) + (1,)


def _inverse(order: Tuple[int, ...]) -> Tuple[int, ...]:
    inverse = [0] * len(order)
    for position, axis in enumerate(order):
        inverse[axis] = position
    return tuple(inverse)


def _laid_out_in(shape: Tuple[int, ...], strides: Tuple[int, ...], itemsize: int,
                 order: Tuple[int, ...]) -> bool:
    """Whether the strides are those of a dense array with the axes ``order`` holds, last
    fastest (torch's rule: axes of size 1 may have any stride)."""
    expected = itemsize
    for axis in reversed(order):
        if shape[axis] != 1:
            if strides[axis] != expected:
                return False
            expected *= shape[axis]
    return True


def is_contiguous_as(array: Any, fmt: memory_format) -> bool:
    """torch's ``is_contiguous(memory_format=fmt)`` for ``array``: a channels-last format holds
    only for an array of its rank; ``preserve_format`` asks about the default layout, as in
    torch."""
    rank = _CHANNELS_LAST_RANK.get(fmt)
    if rank is None:
        return bool(array.flags.c_contiguous)
    return array.ndim == rank and _laid_out_in(array.shape, array.strides, array.itemsize,
                                               _channels_last_order(rank))


def suggested_format(array: Any) -> memory_format:
    """The layout ``preserve_format`` keeps when strides cannot be copied (torch's
    ``suggest_memory_format``): channels last for an array laid out so, else contiguous."""
    for fmt in (channels_last, channels_last_3d):
        if not array.flags.c_contiguous and is_contiguous_as(array, fmt):
            return fmt
    return contiguous_format


def _is_dense(array: Any) -> bool:
    """Non-overlapping and without gaps, in some order of the axes (torch's
    ``is_non_overlapping_and_dense``); negative strides, which torch has not, are not."""
    if array.flags.c_contiguous:
        return True
    order = tuple(sorted(range(array.ndim), key=lambda axis: -array.strides[axis]))
    return all(s >= 0 for s in array.strides) and _laid_out_in(
        array.shape, array.strides, array.itemsize, order)


def empty_in_format(like: Any, fmt: memory_format, dtype: Any = None,
                    xp: Optional[Any] = None) -> Any:
    """An uninitialised array of ``like``'s shape (and ``dtype``, default ``like``'s) laid out
    in ``fmt``; ``preserve_format`` keeps ``like``'s strides when it is dense, else takes
    ``suggested_format``, as torch's ``empty_like``."""
    xp = xp_of(like) if xp is None else xp
    dtype = like.dtype if dtype is None else dtype
    if fmt is preserve_format:
        if _is_dense(like):
            return xp.empty_like(like, dtype=dtype, order="K")
        fmt = suggested_format(like)
    check_rank(like.shape, fmt, "empty_like")
    if fmt is contiguous_format:
        return xp.empty(like.shape, dtype=dtype)
    order = _channels_last_order(like.ndim)
    stored = xp.empty(tuple(like.shape[axis] for axis in order), dtype=dtype)
    return stored.transpose(_inverse(order))


def in_format(array: Any, fmt: memory_format, op: str, always_copy: bool = False) -> Any:
    """``array`` itself when it is laid out in ``fmt`` already (``preserve_format``: always),
    else (or when ``always_copy``) a copy of it that is."""
    check_rank(array.shape, fmt, op)
    if fmt is preserve_format or (not always_copy and is_contiguous_as(array, fmt)):
        return array
    out = empty_in_format(array, fmt)
    out[...] = array
    return out


def full_in_format(like: Any, fill_value: Any, dtype: Any, memory_format: Any, op: str) -> Any:
    """The array of the ``*_like`` factories: ``like``'s shape, ``dtype``, filled with
    ``fill_value`` and laid out in ``memory_format`` (checked, named ``op`` in errors; None is
    ``preserve_format``, as in torch)."""
    fmt = checked_format(preserve_format if memory_format is None else memory_format, op)
    if fmt is contiguous_format or (fmt is preserve_format and like.flags.c_contiguous):
        return xp_of(like).full(like.shape, fill_value, dtype=dtype)  # the usual case, direct
    check_rank(like.shape, fmt, op)
    out = empty_in_format(like, fmt, dtype)
    out[...] = fill_value
    return out
