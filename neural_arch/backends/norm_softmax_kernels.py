"""LayerNorm and softmax over the last axis as Numba kernels: one row at a time, in cache.

``row_ops`` writes them as whole-array operations: LayerNorm's forward makes about eight passes
over memory with a temporary each, softmax five, and the causal mask of attention two more
(``where`` before, and its gradient after). These kernels read a row, reduce it while it sits
in L1, and write the results once. LayerNorm's forward writes ``out`` and, for the backward,
the normalised row and 1/std; its backward gives dx, and accumulates dweight and dbias in
float64 across rows, in one pass. The causal softmax skips the masked tail of each row (it
writes 0 there) instead of reading a mask.

Reductions (sums, dot products) are separate functions compiled with ``reassoc`` so that LLVM
vectorises them; the rest keeps IEEE order (``contract`` only), which ``_exp32``'s argument
reduction needs. No flag drops NaN or infinity semantics: a NaN or +inf in a softmax row makes
the row NaN, and a row with nothing left unmasked (all -inf) is NaN, as in ``row_ops``.

Float32 runs in float32, float64 in float64. Importing this module imports Numba;
``available()`` is False without it or with ``NEURAL_ARCH_NUMBA=0``.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from .erf_kernels import exp_nonpositive32
from .numba_backend import compiled, helper, inlined

# the files its cached machine code is built from (``numba_backend``): itself, the njit
# options of ``numba_backend``, and ``erf_kernels``' exp, inlined, with all it is built from
BUILT_FROM = ("norm_softmax_kernels", "numba_backend", "erf_kernels", "special")

_KEEP = {"fastmath": {"contract"}}
_REDUCE = {"fastmath": {"contract", "reassoc"}}
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@helper(**_REDUCE)
def _sum(a, n):  # pragma: no cover - runs compiled
    s = a[0] - a[0]  # a zero of a's dtype: a literal 0.0 would be float64
    for j in range(n):
        s += a[j]
    return s


@helper(**_REDUCE)
def _dot(a, b, n):  # pragma: no cover - runs compiled
    s = a[0] - a[0]
    for j in range(n):
        s += a[j] * b[j]
    return s


@helper(**_REDUCE)
def _centered_square_sum(a, mean, n):  # pragma: no cover - runs compiled
    s = mean - mean
    for j in range(n):
        d = a[j] - mean
        s += d * d
    return s


# ----- LayerNorm ----------------------------------------------------------------------------
# c = [1 / cols, eps, 1] in the input's dtype: a Python float would make the arithmetic float64.
@compiled(**_KEEP)
def _layer_norm(x, w, b, c, out, normalized, inv_std):  # pragma: no cover - runs compiled
    cols = x.shape[1]
    for r in range(x.shape[0]):
        row, nrm, dst = x[r], normalized[r], out[r]
        mean = _sum(row, cols) * c[0]
        inv = c[2] / np.sqrt(_centered_square_sum(row, mean, cols) * c[0] + c[1])
        inv_std[r] = inv
        for j in range(cols):  # nrm may be dst (no backward): element j is read before written
            v = (row[j] - mean) * inv
            nrm[j] = v
            dst[j] = v * w[j] + b[j]


@compiled(**_KEEP)
def _layer_norm_backward(g, normalized, inv_std, w, c, need_x, gx, gw, gb
                         ):  # pragma: no cover - runs compiled
    # gx = (g w - mean(g w) - n mean(g w n)) / std; gw += g n and gb += g, in float64
    cols = g.shape[1]
    scaled = np.empty(cols, dtype=g.dtype)
    for r in range(g.shape[0]):
        grow, nrow = g[r], normalized[r]
        for j in range(cols):
            gw[j] += grow[j] * np.float64(nrow[j])
            gb[j] += grow[j]
        if need_x:
            for j in range(cols):
                scaled[j] = grow[j] * w[j]
            mean_g = _sum(scaled, cols) * c[0]
            mean_gn = _dot(scaled, nrow, cols) * c[0]
            inv, dst = inv_std[r], gx[r]
            for j in range(cols):
                dst[j] = ((scaled[j] - mean_g) - nrow[j] * mean_gn) * inv


# ----- softmax ------------------------------------------------------------------------------
@inlined
def _softmax_head(row, dst, r, causal, offset, length):  # pragma: no cover - runs compiled
    # (n, max of the first n) for row r, which is query r % length of its (length, cols)
    # matrix: causally it sees columns j <= query + offset, else all. A row that sees nothing
    # is written NaN here (n = 0).
    cols = row.shape[0]
    n = min(cols, max(0, r % length + offset + 1)) if causal else cols
    if n == 0:
        for j in range(cols):
            dst[j] = np.nan
        return 0, row[0]
    top = row[0]
    for j in range(1, n):  # a NaN is skipped here, and then makes the row NaN below
        top = row[j] if row[j] > top else top
    return n, top


@inlined
def _softmax_tail(dst, n):  # pragma: no cover - runs compiled
    # dst[:n] holds exp(x - max): divide by its sum; the masked rest is 0 (n = 0: the head
    # wrote the row NaN)
    if n > 0:
        total = _sum(dst, n)
        for j in range(n):
            dst[j] = dst[j] / total
        for j in range(n, dst.shape[0]):
            dst[j] = 0


@helper(**_KEEP)
def _exp_shifted32(row, top, dst, n):  # pragma: no cover - runs compiled
    # A function of its own: written inline in the row loop below, LLVM left this loop scalar
    # (2.3x slower for 64-element rows).
    for j in range(n):
        dst[j] = exp_nonpositive32(row[j] - top)


# One kernel per dtype: float32 takes the vectorisable exp, float64 libm's.
@compiled(**_KEEP)
def _softmax32(x, out, causal, offset, length):  # pragma: no cover - runs compiled
    for r in range(x.shape[0]):
        row, dst = x[r], out[r]
        n, top = _softmax_head(row, dst, r, causal, offset, length)
        _exp_shifted32(row, top, dst, n)
        _softmax_tail(dst, n)


@compiled(**_KEEP)
def _softmax64(x, out, causal, offset, length):  # pragma: no cover - runs compiled
    for r in range(x.shape[0]):
        row, dst = x[r], out[r]
        n, top = _softmax_head(row, dst, r, causal, offset, length)
        for j in range(n):
            dst[j] = math.exp(row[j] - top)
        _softmax_tail(dst, n)


@compiled(**_KEEP)
def _softmax_backward(g, out, gx):  # pragma: no cover - runs compiled
    cols = g.shape[1]
    for r in range(g.shape[0]):
        grow, orow, dst = g[r], out[r], gx[r]
        d = _dot(grow, orow, cols)
        for j in range(cols):
            dst[j] = grow[j] * orow[j] - orow[j] * d


def available() -> bool:
    """True when the kernels run (Numba installed and not switched off)."""
    return all(k is not None for k in (_layer_norm, _layer_norm_backward, _softmax32,
                                       _softmax64, _softmax_backward))


def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` as a C-contiguous (rows, last axis) array, copying only when it is not one."""
    return np.ascontiguousarray(a).reshape(-1, a.shape[-1])


def layer_norm(x: np.ndarray, weight: Optional[np.ndarray], bias: Optional[np.ndarray],
               eps: float, keep: bool) -> Tuple[np.ndarray, Optional[np.ndarray],
                                                Optional[np.ndarray]]:
    """As ``row_ops.layer_norm`` for float32 or float64 ``x`` (and weight and bias of its
    dtype, or None), over a last axis of at least one element."""
    dtype, cols = x.dtype, x.shape[-1]
    rows = _rows(x)
    w = np.ones(cols, dtype) if weight is None else np.ascontiguousarray(weight)
    b = np.zeros(cols, dtype) if bias is None else np.ascontiguousarray(bias)
    c = np.array([1.0 / cols, eps, 1.0], dtype)
    out = np.empty_like(rows)
    normalized = np.empty_like(rows) if keep else out
    inv_std = np.empty(rows.shape[0], dtype)
    _layer_norm(rows, w, b, c, out, normalized, inv_std)
    if not keep:
        return out.reshape(x.shape), None, None
    return (out.reshape(x.shape), normalized.reshape(x.shape),
            inv_std.reshape(x.shape[:-1] + (1,)))


def layer_norm_backward(g: np.ndarray, normalized: np.ndarray, inv_std: np.ndarray,
                        weight: Optional[np.ndarray], need: Tuple[bool, bool, bool]
                        ) -> Tuple[Any, Any, Any]:
    """As ``row_ops.layer_norm_backward``, from this module's ``layer_norm``."""
    dtype, cols = normalized.dtype, normalized.shape[-1]
    rows = _rows(g)
    w = np.ones(cols, dtype) if weight is None else np.ascontiguousarray(weight)
    c = np.array([1.0 / cols], dtype)
    gx = np.empty_like(rows) if need[0] else rows[:1]  # unused unless need_x
    gw, gb = np.zeros(cols), np.zeros(cols)
    _layer_norm_backward(rows, _rows(normalized), inv_std.reshape(-1), w, c, need[0], gx, gw,
                         gb)
    return (gx.reshape(g.shape) if need[0] else None, gw.astype(dtype) if need[1] else None,
            gb.astype(dtype) if need[2] else None)


def softmax(x: np.ndarray, causal_offset: Optional[int]) -> np.ndarray:
    """As ``row_ops.softmax`` over the last axis of float32 or float64 ``x`` (at least one
    element per row; with ``causal_offset``, at least two dimensions)."""
    rows = _rows(x)
    out = np.empty_like(rows)
    causal = causal_offset is not None
    kernel = _softmax32 if rows.dtype == np.float32 else _softmax64
    kernel(rows, out, causal, int(causal_offset) if causal else 0,
             x.shape[-2] if causal else 1)
    return out.reshape(x.shape)


def softmax_backward(g: np.ndarray, out: np.ndarray) -> np.ndarray:
    """As ``row_ops.softmax_backward`` over the last axis."""
    rows = _rows(g)
    gx = np.empty_like(rows)
    _softmax_backward(rows, _rows(out), gx)
    return gx.reshape(g.shape)
