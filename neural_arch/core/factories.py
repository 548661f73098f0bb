"""Tensor factories (``tensor``, ``zeros``, ``randn``, ...). Float results default to float32.

With ``device=None`` a factory's tensor lands on ``neural_arch.backends.default_device()``.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .dtypes import DEFAULT_FLOAT, resolve_dtype
from .random import resolve_rng
from .tensor import Tensor
from .torch_memory_format import full_in_format, preserve_format


def _shape(shape: tuple) -> tuple:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    return tuple(int(n) for n in shape)


def _make(array: Any, requires_grad: bool, device: Optional[str]) -> Tensor:
    return Tensor(array, requires_grad=requires_grad, device=device)


def tensor(data: Any, dtype: Any = None, requires_grad: bool = False,
           device: Optional[str] = None) -> Tensor:
    """A new tensor holding a copy of ``data``."""
    if isinstance(data, Tensor):
        source, device = data.array, device or data.device  # a copy stays where its source is
    else:
        source = data
    copied = source.copy() if hasattr(source, "copy") and hasattr(source, "shape") else source
    return Tensor(copied, requires_grad=requires_grad, dtype=dtype, device=device)


def from_numpy(array: np.ndarray, requires_grad: bool = False) -> Tensor:
    """A tensor sharing memory with ``array`` (its dtype is kept)."""
    if not isinstance(array, np.ndarray):
        raise TypeError(f"from_numpy expects a numpy.ndarray, got {type(array).__name__}")
    # always the host: a copy to the default device would no longer share memory
    return Tensor(array, requires_grad=requires_grad, device="cpu")


def zeros(*shape: Any, dtype: Any = None, requires_grad: bool = False,
          device: Optional[str] = None) -> Tensor:
    return _make(np.zeros(_shape(shape), dtype=resolve_dtype(dtype or DEFAULT_FLOAT)),
                 requires_grad, device)


def ones(*shape: Any, dtype: Any = None, requires_grad: bool = False,
         device: Optional[str] = None) -> Tensor:
    return _make(np.ones(_shape(shape), dtype=resolve_dtype(dtype or DEFAULT_FLOAT)),
                 requires_grad, device)


def full(shape: Any, fill_value: Any, dtype: Any = None, requires_grad: bool = False,
         device: Optional[str] = None) -> Tensor:
    shape = _shape(shape if isinstance(shape, (tuple, list)) else (shape,))
    return _make(np.full(shape, fill_value, dtype=resolve_dtype(dtype or DEFAULT_FLOAT)),
                 requires_grad, device)


def eye(n: int, m: Optional[int] = None, dtype: Any = None, requires_grad: bool = False,
        device: Optional[str] = None) -> Tensor:
    return _make(np.eye(n, m, dtype=resolve_dtype(dtype or DEFAULT_FLOAT)), requires_grad, device)


def _like(other: Any, dtype: Any) -> tuple:
    data = other.array if isinstance(other, Tensor) else np.asarray(other)
    return data, resolve_dtype(dtype) if dtype is not None else data.dtype


def zeros_like(other: Any, dtype: Any = None, requires_grad: bool = False,
               device: Optional[str] = None, *, memory_format: Any = preserve_format) -> Tensor:
    """Zeros of ``other``'s shape (and dtype, device and, by default, layout)."""
    data, dt = _like(other, dtype)
    device = device or (other.device if isinstance(other, Tensor) else None)
    return _make(full_in_format(data, 0, dt, memory_format, "zeros_like"), requires_grad, device)


def ones_like(other: Any, dtype: Any = None, requires_grad: bool = False,
              device: Optional[str] = None, *, memory_format: Any = preserve_format) -> Tensor:
    """Ones of ``other``'s shape (and dtype, device and, by default, layout)."""
    data, dt = _like(other, dtype)
    device = device or (other.device if isinstance(other, Tensor) else None)
    return _make(full_in_format(data, 1, dt, memory_format, "ones_like"), requires_grad, device)


def randn(*shape: Any, dtype: Any = None, requires_grad: bool = False,
          device: Optional[str] = None, seed: Optional[int] = None,
          rng: Optional[np.random.Generator] = None) -> Tensor:
    """Standard normal samples from ``rng``, a generator seeded with ``seed``, or the global one."""
    generator = resolve_rng(seed, rng)
    dt = resolve_dtype(dtype or DEFAULT_FLOAT)
    return _make(generator.standard_normal(_shape(shape)).astype(dt, copy=False),
                 requires_grad, device)


def rand(*shape: Any, dtype: Any = None, requires_grad: bool = False,
         device: Optional[str] = None, seed: Optional[int] = None,
         rng: Optional[np.random.Generator] = None) -> Tensor:
    """Uniform samples in [0, 1) (see ``randn`` for the generator choice)."""
    generator = resolve_rng(seed, rng)
    dt = resolve_dtype(dtype or DEFAULT_FLOAT)
    return _make(generator.random(_shape(shape)).astype(dt, copy=False), requires_grad, device)


def arange(start: Any, stop: Any = None, step: Any = 1, dtype: Any = None,
           requires_grad: bool = False, device: Optional[str] = None) -> Tensor:
    """Evenly spaced values; int64 when all arguments are ints, else float32."""
    if stop is None:
        start, stop = 0, start
    if dtype is None:
        integral = all(isinstance(v, (int, np.integer)) for v in (start, stop, step))
        dtype = np.int64 if integral else DEFAULT_FLOAT
    return _make(np.arange(start, stop, step, dtype=resolve_dtype(dtype)), requires_grad, device)
