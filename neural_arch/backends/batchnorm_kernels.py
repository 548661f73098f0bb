"""Batch normalisation over (N, C, S) arrays as Numba kernels: one channel at a time, in cache.

The NumPy form (``core.ops_batchnorm``) makes about six passes over memory with a temporary
each way: mean, centred copy, variance, normalised copy, scaled output; the backward as many.
Here one channel's N * S values are reduced and then written while they sit in L2: the forward
reads x, computes the mean and the biased variance (two passes, for accuracy) and writes
``(x - mean) * inv_std * w + b``; the backward reads g and x once for the two per-channel sums
and once more to write the input gradient, recomputing the normalised x instead of keeping it.

Sums run in the input's dtype along a row of S values (reassociated, so that LLVM vectorises
them) and in float64 across the N rows. Float32 runs in float32, float64 in float64. Importing
this module imports Numba; ``available()`` is False without it or with ``NEURAL_ARCH_NUMBA=0``.
"""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from .numba_backend import compiled, helper

# the files its cached machine code is built from (``numba_backend``): itself, and the njit
# options of ``numba_backend``
BUILT_FROM = ("batchnorm_kernels", "numba_backend")

_KEEP = {"fastmath": {"contract"}}
_REDUCE = {"fastmath": {"contract", "reassoc"}}
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@helper(**_REDUCE)
def _sum(a):  # pragma: no cover - runs compiled
    s = a[0] - a[0]  # a zero of a's dtype: a literal 0.0 would be float64
    for j in range(a.shape[0]):
        s += a[j]
    return s


@helper(**_REDUCE)
def _centered_square_sum(a, mean):  # pragma: no cover - runs compiled
    s = mean - mean
    for j in range(a.shape[0]):
        d = a[j] - mean
        s += d * d
    return s


@helper(**_REDUCE)
def _centered_dot(g, a, mean):  # pragma: no cover - runs compiled
    s = mean - mean
    for j in range(a.shape[0]):
        s += g[j] * (a[j] - mean)
    return s


@helper(**_KEEP)
def _channel_moments(x, ch, mean, var):  # pragma: no cover - runs compiled
    # mean[ch], var[ch] (biased) of x[:, ch, :]; the mean is stored, then read back in x's dtype
    n = x.shape[0]
    count = n * x.shape[2]
    total = 0.0
    for i in range(n):
        total += _sum(x[i, ch])
    mean[ch] = total / count
    m = mean[ch]
    squares = 0.0
    for i in range(n):
        squares += _centered_square_sum(x[i, ch], m)
    var[ch] = squares / count


@compiled(**_KEEP)
def _statistics(x, mean, var):  # pragma: no cover - runs compiled
    for ch in range(x.shape[1]):
        _channel_moments(x, ch, mean, var)


@compiled(**_KEEP)
def _normalize(x, mean, scale, shift, out):  # pragma: no cover - runs compiled
    # out = (x - mean) * scale + shift per channel, scale = inv_std * w
    for i in range(x.shape[0]):
        for ch in range(x.shape[1]):
            row, dst = x[i, ch], out[i, ch]
            m, a, b = mean[ch], scale[ch], shift[ch]
            for j in range(row.shape[0]):
                dst[j] = (row[j] - m) * a + b


@compiled(**_KEEP)
def _forward(x, w, b, eps, out, mean, var, inv_std):  # pragma: no cover - runs compiled
    # statistics and output one channel at a time, so that the channel is read from memory
    # once and written from cache
    for ch in range(x.shape[1]):
        _channel_moments(x, ch, mean, var)
        m = mean[ch]
        inv_std[ch] = 1.0 / np.sqrt(var[ch] + eps[0])
        a = inv_std[ch] * w[ch]
        shift = b[ch]
        for i in range(x.shape[0]):
            row, dst = x[i, ch], out[i, ch]
            for j in range(row.shape[0]):
                dst[j] = (row[j] - m) * a + shift


@compiled(**_KEEP)
def _gradient_sums(g, x, mean, inv_std, sums):  # pragma: no cover - runs compiled
    # sums[0, c] = sum of g, sums[1, c] = sum of g * x_hat over x[:, c, :]
    for ch in range(x.shape[1]):
        m = mean[ch]
        sum_g = 0.0
        sum_gc = 0.0
        for i in range(x.shape[0]):
            sum_g += _sum(g[i, ch])
            sum_gc += _centered_dot(g[i, ch], x[i, ch], m)
        sums[0, ch] = sum_g
        sums[1, ch] = sum_gc * inv_std[ch]


@compiled(**_KEEP)
def _backward(g, x, mean, inv_std, w, count, sums, gx):  # pragma: no cover - runs compiled
    # _gradient_sums and _input_gradient one channel at a time (local sums: no group to
    # reduce over), so that g and x are read from memory once
    for ch in range(x.shape[1]):
        m, s = mean[ch], inv_std[ch]
        sum_g = 0.0
        sum_gc = 0.0
        for i in range(x.shape[0]):
            sum_g += _sum(g[i, ch])
            sum_gc += _centered_dot(g[i, ch], x[i, ch], m)
        sums[0, ch] = sum_g
        sums[1, ch] = sum_gc * s
        a = s * w[ch]
        k = sums[0, ch] / count[0]
        h = sums[1, ch] / count[0]
        for i in range(x.shape[0]):
            grow, row, dst = g[i, ch], x[i, ch], gx[i, ch]
            for j in range(row.shape[0]):
                dst[j] = (grow[j] - k - (row[j] - m) * s * h) * a


@compiled(**_KEEP)
def _input_gradient(g, x, mean, inv_std, scale, mean_g, mean_g_hat, gx
                    ):  # pragma: no cover - runs compiled
    # gx = (g - mean(g) - x_hat * mean(g x_hat)) * inv_std * w, x_hat = (x - mean) * inv_std
    for i in range(x.shape[0]):
        for ch in range(x.shape[1]):
            grow, row, dst = g[i, ch], x[i, ch], gx[i, ch]
            m, s, a, k, h = mean[ch], inv_std[ch], scale[ch], mean_g[ch], mean_g_hat[ch]
            for j in range(row.shape[0]):
                dst[j] = (grow[j] - k - (row[j] - m) * s * h) * a


def available() -> bool:
    """True when the kernels run (Numba installed and not switched off)."""
    return all(k is not None for k in (_statistics, _normalize, _forward, _gradient_sums,
                                       _backward, _input_gradient))


def as_channels(a: np.ndarray) -> np.ndarray:
    """A C-contiguous (N, C, ...) array viewed as (N, C, S)."""
    return a.reshape(a.shape[0], a.shape[1], -1)


def statistics(x: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """Per-channel (mean, biased variance) of C-contiguous ``x``, in its dtype."""
    x3 = as_channels(x)
    mean, var = np.empty(x3.shape[1], x.dtype), np.empty(x3.shape[1], x.dtype)
    _statistics(x3, mean, var)
    return mean, var


def _affine(channels: int, dtype: np.dtype, weight: Optional[np.ndarray],
            bias: Optional[np.ndarray]) -> Tuple[np.ndarray, np.ndarray]:
    w = np.ones(channels, dtype) if weight is None else np.ascontiguousarray(weight, dtype)
    b = np.zeros(channels, dtype) if bias is None else np.ascontiguousarray(bias, dtype)
    return w, b


def forward(x: np.ndarray, weight: Optional[np.ndarray], bias: Optional[np.ndarray],
            eps: float) -> Tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Training forward with the batch's statistics: (out, mean, biased var, inv_std)."""
    x3 = as_channels(x)
    channels, dtype = x3.shape[1], x.dtype
    w, b = _affine(channels, dtype, weight, bias)
    out = np.empty_like(x3)
    mean, var, inv_std = (np.empty(channels, dtype) for _ in range(3))
    _forward(x3, w, b, np.array([eps], dtype), out, mean, var, inv_std)
    return out.reshape(x.shape), mean, var, inv_std


def normalize(x: np.ndarray, mean: np.ndarray, inv_std: np.ndarray,
              weight: Optional[np.ndarray], bias: Optional[np.ndarray]) -> np.ndarray:
    """``(x - mean) * inv_std * w + b`` per channel, from given statistics."""
    x3 = as_channels(x)
    w, b = _affine(x3.shape[1], x.dtype, weight, bias)
    out = np.empty_like(x3)
    _normalize(x3, np.ascontiguousarray(mean, x.dtype), (inv_std * w).astype(x.dtype),
               b, out)
    return out.reshape(x.shape)


def gradient_sums(g: np.ndarray, x: np.ndarray, mean: np.ndarray,
                  inv_std: np.ndarray) -> np.ndarray:
    """The (2, C) per-channel sums of g and of g * x_hat, in x's dtype."""
    g3 = as_channels(np.ascontiguousarray(g, x.dtype))
    sums = np.empty((2, g3.shape[1]), x.dtype)
    _gradient_sums(g3, as_channels(x), mean, inv_std, sums)
    return sums


def input_gradient(g: np.ndarray, x: np.ndarray, mean: np.ndarray, inv_std: np.ndarray,
                   weight: Optional[np.ndarray], sums: np.ndarray, count: int) -> np.ndarray:
    """The input's gradient from the (possibly group-reduced) ``sums`` over ``count`` values."""
    x3 = as_channels(x)
    g3 = as_channels(np.ascontiguousarray(g, x.dtype))
    scale = inv_std if weight is None else (inv_std * weight).astype(x.dtype)
    mean_g, mean_g_hat = (np.ascontiguousarray(s / count, x.dtype) for s in sums)
    gx = np.empty_like(x3)
    _input_gradient(g3, x3, mean, inv_std, scale, mean_g, mean_g_hat, gx)
    return gx.reshape(x.shape)


def backward(g: np.ndarray, x: np.ndarray, mean: np.ndarray, inv_std: np.ndarray,
             weight: Optional[np.ndarray], count: int) -> Tuple[np.ndarray, np.ndarray]:
    """(input gradient, (2, C) sums of g and g * x_hat) with the local sums, in one pass."""
    x3 = as_channels(x)
    g3 = as_channels(np.ascontiguousarray(g, x.dtype))
    w = np.ones(x3.shape[1], x.dtype) if weight is None else weight
    sums = np.empty((2, x3.shape[1]), x.dtype)
    gx = np.empty_like(x3)
    _backward(g3, x3, mean, inv_std, w, np.array([count], x.dtype), sums, gx)
    return gx.reshape(x.shape), sums
