"""More of torch's Tensor methods: ``max`` / ``min`` / ``argmax`` / ``argmin`` with torch's
overloads (``ops_extremes``), ``narrow`` and ``view_as`` (views), and the ``new_*`` factories
(``new_zeros``, ``new_ones``, ``new_full``, ``new_empty``, ``new_tensor``), which make a tensor
with this one's dtype and device unless told otherwise.

A base class of ``Tensor``, loaded before it: the op module (and through it ``Tensor``) is
found on first call.
"""
from __future__ import annotations

import importlib
import numbers
import operator
import warnings
from typing import Any

import numpy as np

from ..backends import xp_of
from .dtypes import resolve_dtype

_extremes = None  # ops_extremes, which imports tensor.py (which imports this module first)


def _ops() -> Any:
    global _extremes
    if _extremes is None:
        _extremes = importlib.import_module(f"{__package__}.ops_extremes")
    return _extremes


def _plain_tensor(array: Any, requires_grad: bool, device: Any) -> Any:
    """A ``Tensor`` (never a subclass such as ``Parameter``, as in torch) holding ``array``."""
    return _ops().Tensor(array, requires_grad=requires_grad, device=device)


def narrow(input: Any, dim: int, start: Any, length: int) -> Any:
    """``input`` along ``dim`` from ``start`` (negative counts from the end; an integer 0-d
    tensor is taken) for ``length`` elements: a view sharing memory and the version counter,
    whose gradient flows back to those places."""
    ndim = input.array.ndim
    if ndim == 0:
        raise RuntimeError("narrow() cannot be applied to a 0-dim tensor.")
    axis = _ops().reduction_axis(input, dim, "narrow")
    try:
        start = operator.index(start)
        length = operator.index(length)
    except TypeError:
        raise TypeError(f"narrow() takes (int dim, int start, int length), got start "
                        f"{start!r} and length {length!r}") from None
    size = input.array.shape[axis]
    if not -size <= start <= size:
        raise IndexError(f"start out of range (expected to be in range of [{-size}, {size}], "
                         f"but got {start})")
    if length < 0:
        raise RuntimeError("narrow(): length must be non-negative.")
    start %= size if size else 1
    if start + length > size:
        raise RuntimeError(f"start ({start}) + length ({length}) exceeds dimension size "
                           f"({size}).")
    return input[(slice(None),) * axis + (slice(start, start + length),)]


def _size(args: tuple, size: Any, op: str) -> tuple:
    """torch's ``*size`` / ``size=`` argument as a tuple of non-negative ints."""
    if size is not None:
        if args:
            raise TypeError(f"{op}() got the size both as arguments {args} and as size={size}")
        args = (size,)
    if not args:
        raise TypeError(f'{op}() missing 1 required positional arguments: "size"')
    if len(args) == 1 and isinstance(args[0], (tuple, list)):
        args = tuple(args[0])
    for n in args:
        if isinstance(n, bool) or not isinstance(n, numbers.Integral):
            raise TypeError(f"{op}(): argument 'size' must be a tuple of ints, but got "
                            f"{type(n).__name__} {n!r} in {args}")
        if n < 0:
            raise RuntimeError(f"{op}(): Trying to create tensor with negative dimension {n}: "
                               f"{list(args)}")
    return tuple(int(n) for n in args)


class TorchExtraMethods:
    """Mixed into ``Tensor``; relies on its ``array``, ``device``, ``view`` and indexing."""

    __slots__ = ()

    # ----------------------------------------------------------------- extremes
    def max(self, dim: Any = None, keepdim: Any = None, **kwargs: Any) -> Any:
        """``max()``, ``max(dim, keepdim=False)`` -> ``(values, indices)``, ``max(other)``;
        ``max(axis=..., keepdims=...)`` gives the values alone."""
        return _ops().max(self, *_positional(dim, keepdim), **kwargs)

    def min(self, dim: Any = None, keepdim: Any = None, **kwargs: Any) -> Any:
        """As ``max``, for the smallest values."""
        return _ops().min(self, *_positional(dim, keepdim), **kwargs)

    def argmax(self, dim: Any = None, keepdim: bool = False, **kwargs: Any) -> Any:
        return _ops().argmax(self, dim, keepdim, **kwargs)

    def argmin(self, dim: Any = None, keepdim: bool = False, **kwargs: Any) -> Any:
        return _ops().argmin(self, dim, keepdim, **kwargs)

    def norm(self, p: Any = "fro", dim: Any = None, keepdim: bool = False,
             dtype: Any = None) -> Any:
        """torch's vector norm (``ops_norm``), with its gradient."""
        return importlib.import_module(f"{__package__}.ops_norm").norm(self, p, dim, keepdim,
                                                                       dtype)

    def any(self, dim: Any = None, keepdim: bool = False, **numpy_kwargs: Any) -> Any:
        """torch's ``any``: a bool tensor, over all elements or along ``dim``."""
        return self._truth("any", dim, keepdim, numpy_kwargs)

    def all(self, dim: Any = None, keepdim: bool = False, **numpy_kwargs: Any) -> Any:
        """torch's ``all``: a bool tensor, over all elements or along ``dim``."""
        return self._truth("all", dim, keepdim, numpy_kwargs)

    def _truth(self, op: str, dim: Any, keepdim: bool, numpy_kwargs: dict) -> Any:
        # np.any(tensor) / np.all(tensor) call these methods with NumPy's names
        if numpy_kwargs.pop("out", None) is not None or set(numpy_kwargs) - {"axis", "keepdims"}:
            raise TypeError(f"{op}() takes dim and keepdim (or NumPy's axis and keepdims), got "
                            f"{sorted(numpy_kwargs)}")
        dim = numpy_kwargs.get("axis", dim)
        keepdim = numpy_kwargs.get("keepdims", keepdim)
        if isinstance(dim, tuple) or (dim is not None and not isinstance(dim, (int, np.integer))):
            result = getattr(xp_of(self.array), op)(self.array != 0, axis=dim, keepdims=keepdim)
            return _plain_tensor(result, False, self.device)
        xp = xp_of(self.array)
        axis = None if dim is None else _ops().reduction_axis(self, dim, op)
        if self.array.ndim == 0:
            axis = None  # dim 0 of a 0-d tensor is the tensor itself, as in torch
        result = getattr(xp, op)(self.array != 0, axis=axis,
                                 keepdims=bool(keepdim) and axis is not None)
        return _plain_tensor(xp.asarray(result), False, self.device)

    # ----------------------------------------------------------------- views
    def narrow(self, dim: int, start: Any, length: int) -> Any:
        return narrow(self, dim, start, length)

    def view_as(self, other: Any) -> Any:
        """``self.view(other.shape)``: the same data in ``other``'s shape."""
        return self.view(*tuple(other.shape))

    # ----------------------------------------------------------------- new tensors like self
    def _new(self, make: Any, dtype: Any, device: Any, requires_grad: bool) -> Any:
        dtype = self.array.dtype if dtype is None else resolve_dtype(dtype)
        array = make(xp_of(self.array), dtype)
        return _plain_tensor(array, requires_grad, self.device if device is None else device)

    def new_zeros(self, *size: Any, dtype: Any = None, device: Any = None,
                  requires_grad: bool = False, **torch_only: Any) -> Any:
        shape = _size(size, torch_only.pop("size", None), "new_zeros")
        _no_more("new_zeros", torch_only)
        return self._new(lambda xp, dt: xp.zeros(shape, dtype=dt), dtype, device,
                         requires_grad)

    def new_ones(self, *size: Any, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False, **torch_only: Any) -> Any:
        shape = _size(size, torch_only.pop("size", None), "new_ones")
        _no_more("new_ones", torch_only)
        return self._new(lambda xp, dt: xp.ones(shape, dtype=dt), dtype, device,
                         requires_grad)

    def new_empty(self, *size: Any, dtype: Any = None, device: Any = None,
                  requires_grad: bool = False, **torch_only: Any) -> Any:
        """As ``new_zeros``: the memory is always zeroed here."""
        shape = _size(size, torch_only.pop("size", None), "new_empty")
        _no_more("new_empty", torch_only)
        return self._new(lambda xp, dt: xp.zeros(shape, dtype=dt), dtype, device,
                         requires_grad)

    def new_full(self, size: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
                 requires_grad: bool = False, **torch_only: Any) -> Any:
        if not isinstance(size, (tuple, list)):
            raise TypeError(f"new_full(): argument 'size' (position 1) must be tuple of ints, "
                            f"not {type(size).__name__}")
        shape = _size((size,), None, "new_full")
        _no_more("new_full", torch_only)
        return self._new(lambda xp, dt: xp.full(shape, fill_value, dtype=dt), dtype, device,
                         requires_grad)

    def new_tensor(self, data: Any, dtype: Any = None, device: Any = None,
                   requires_grad: bool = False) -> Any:
        """A copy of ``data`` (never sharing memory, never in a graph), in this tensor's dtype
        and on its device unless told otherwise."""
        if isinstance(data, TorchExtraMethods):
            warnings.warn("To copy construct from a tensor, it is recommended to use "
                          "sourceTensor.detach().clone() or sourceTensor.detach().clone()"
                          ".requires_grad_(True), rather than tensor.new_tensor(sourceTensor).",
                          UserWarning, stacklevel=2)
            data = data.numpy() if self.device == "cpu" else data.array  # copied below
        return self._new(lambda xp, dt: xp.array(data, dtype=dt, copy=True), dtype, device,
                         requires_grad)


def _positional(dim: Any, keepdim: Any) -> tuple:
    """The arguments the caller passed, so ``ops_extremes`` can tell absent from None."""
    if keepdim is not None:
        return (dim, keepdim)
    return () if dim is None else (dim,)


def _no_more(op: str, torch_only: dict) -> None:
    # torch's layout= and pin_memory= have one meaning here (strided, pageable): accept those
    torch_only.pop("layout", None)
    torch_only.pop("pin_memory", None)
    if torch_only:
        raise TypeError(f"{op}() got unexpected keyword arguments {sorted(torch_only)}")


__all__ = ["TorchExtraMethods", "narrow"]
