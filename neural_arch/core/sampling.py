"""Random sampling with torch's signatures: ``randn``, ``rand``, ``randint``, ``randperm``,
``randn_like``, ``rand_like`` and ``multinomial``, all taking ``generator=``."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import factories
from .dtypes import is_floating, resolve_dtype
from .generator import resolve_generator
from .tensor import Tensor


def randn(*size: Any, generator: Any = None, dtype: Any = None, device: Any = None,
          requires_grad: bool = False, seed: Optional[int] = None, rng: Any = None) -> Tensor:
    """Standard normal samples; ``size`` as several ints or one tuple (float32 by default)."""
    if seed is not None:  # the older seed= spelling keeps its own fresh generator
        return factories.randn(*size, dtype=dtype, requires_grad=requires_grad, device=device,
                               seed=seed, rng=rng)
    return factories.randn(*size, dtype=dtype, requires_grad=requires_grad, device=device,
                           rng=resolve_generator(generator, rng))


def rand(*size: Any, generator: Any = None, dtype: Any = None, device: Any = None,
         requires_grad: bool = False, seed: Optional[int] = None, rng: Any = None) -> Tensor:
    """Uniform samples in [0, 1) (see ``randn``)."""
    if seed is not None:
        return factories.rand(*size, dtype=dtype, requires_grad=requires_grad, device=device,
                              seed=seed, rng=rng)
    return factories.rand(*size, dtype=dtype, requires_grad=requires_grad, device=device,
                          rng=resolve_generator(generator, rng))


def _like(input: Any, dtype: Any, op: str) -> tuple:
    """(shape, floating dtype, device) of a ``*_like`` result."""
    data = input.array if isinstance(input, Tensor) else np.asarray(input)
    wanted = resolve_dtype(dtype) if dtype is not None else data.dtype
    if not is_floating(wanted):
        raise TypeError(f"{op} needs a floating dtype, got {wanted}")
    return tuple(data.shape), wanted, getattr(input, "device", None)


def randn_like(input: Any, *, dtype: Any = None, device: Any = None,
               requires_grad: bool = False, generator: Any = None) -> Tensor:
    shape, wanted, source_device = _like(input, dtype, "randn_like")
    return randn(shape, generator=generator, dtype=wanted, requires_grad=requires_grad,
                 device=device or source_device)


def rand_like(input: Any, *, dtype: Any = None, device: Any = None,
              requires_grad: bool = False, generator: Any = None) -> Tensor:
    shape, wanted, source_device = _like(input, dtype, "rand_like")
    return rand(shape, generator=generator, dtype=wanted, requires_grad=requires_grad,
                device=device or source_device)


def _size(size: Any) -> tuple:
    if isinstance(size, (int, np.integer)):
        return (int(size),)
    if not isinstance(size, (tuple, list)):
        raise TypeError(f"size must be a tuple of ints, got {type(size).__name__} {size!r}")
    return tuple(int(n) for n in size)


def randint(*args: Any, size: Any = None, generator: Any = None, dtype: Any = None,
            device: Any = None, requires_grad: bool = False) -> Tensor:
    """``randint(high, size)`` or ``randint(low, high, size)``: integers in [low, high), int64
    by default."""
    if size is None and args:
        args, size = args[:-1], args[-1]
    if len(args) == 1:
        low, high = 0, args[0]
    elif len(args) == 2:
        low, high = args
    else:
        raise TypeError(f"randint expects (high, size) or (low, high, size), got {len(args)} "
                        "bounds")
    if size is None:
        raise TypeError("randint() missing the size argument")
    low, high = int(low), int(high)
    if high <= low:
        raise RuntimeError(f"randint expects low < high, got low={low} >= high={high}")
    wanted = resolve_dtype(dtype if dtype is not None else np.int64)
    draws = resolve_generator(generator).integers(low, high, _size(size), dtype=np.int64)
    return Tensor(draws.astype(wanted, copy=False), requires_grad=requires_grad, device=device)


def randperm(n: int, *, generator: Any = None, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    """A random permutation of ``0 .. n-1`` (int64 by default)."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
        raise RuntimeError(f"randperm needs a non-negative int n, got {n!r}")
    wanted = resolve_dtype(dtype if dtype is not None else np.int64)
    order = resolve_generator(generator).permutation(int(n)).astype(wanted, copy=False)
    return Tensor(order, requires_grad=requires_grad, device=device)


def _check_weights(weights: np.ndarray, num_samples: int, replacement: bool) -> None:
    if weights.ndim not in (1, 2):
        raise RuntimeError(f"multinomial: prob_dist must be 1 or 2 dim, got shape "
                           f"{weights.shape}")
    categories = weights.shape[-1]
    if categories == 0:
        raise RuntimeError("multinomial: the distribution has no categories")
    if not np.all(np.isfinite(weights)) or np.any(weights < 0):
        raise RuntimeError("multinomial: probability tensor contains either inf, nan or "
                           "element < 0")
    if np.any(weights.sum(axis=-1) <= 0):
        raise RuntimeError("multinomial: invalid distribution (sum of probabilities <= 0)")
    if num_samples < 0 or (not replacement and num_samples > categories):
        raise RuntimeError(f"multinomial: cannot sample {num_samples} samples from "
                           f"{categories} categories without replacement" if not replacement
                           else f"multinomial: num_samples must be >= 0, got {num_samples}")
    if not replacement and np.any((weights > 0).sum(axis=-1) < num_samples):
        raise RuntimeError(f"multinomial: invalid distribution (with replacement=False, fewer "
                           f"than {num_samples} categories have non-zero weight)")


def multinomial(input: Any, num_samples: int, replacement: bool = False, *,
                generator: Any = None) -> Tensor:
    """Indices drawn from each row of non-negative ``input`` weights (they need not sum to 1);
    shape ``(num_samples,)`` or ``(rows, num_samples)``, int64."""
    source = input.numpy() if isinstance(input, Tensor) else np.asarray(input)
    weights = source.astype(np.float64)
    num_samples = int(num_samples)
    _check_weights(weights, num_samples, replacement)
    rows = weights.reshape(-1, weights.shape[-1])
    rng = resolve_generator(generator)
    if replacement:
        cdf = np.cumsum(rows, axis=-1)
        draws = rng.random((rows.shape[0], num_samples)) * cdf[:, -1:]
        picked = np.stack([np.searchsorted(c, d, side="right") for c, d in zip(cdf, draws)])
        # rounding may put a draw at the total: it belongs to the last non-zero category
        last = rows.shape[-1] - 1 - np.argmax(rows[:, ::-1] > 0, axis=-1)
        picked = np.minimum(picked, last[:, None])
    else:
        # Exponential race: drawing one by one, each with probability proportional to the
        # weights left, is the same as taking the smallest Exp(1)/weight keys in order.
        with np.errstate(divide="ignore"):
            keys = rng.standard_exponential(rows.shape) / rows
        picked = np.argsort(keys, axis=-1, kind="stable")[:, :num_samples]
    out = picked.astype(np.int64).reshape(weights.shape[:-1] + (num_samples,))
    return Tensor(out, device=getattr(input, "device", None))
