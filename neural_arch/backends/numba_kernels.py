"""CPU kernels with a Numba form and a NumPy form: the Numba one runs only where it measured faster.

``benchmarks/bench_numba.py`` times both forms of every kernel in the same run; ``NUMBA_LIMITS``
records, per kernel, up to which input size the Numba form won there (ratios beside it). A
public function runs the Numba form for inputs within that limit when Numba is available, and
the NumPy form otherwise; both give the same result (bit for bit, except the cross-entropy
sums, which the Numba form accumulates in float64).

- ``reduce_sum_into(out, slots)``: ``out = slots[0] + slots[1] + ...``, left to right, in
  cache-sized blocks (the shared-memory all-reduce's inner loop).
- ``cast_to_float16(src, out=None)``: float32 -> float16, round to nearest even.
- ``topk_compress(grad, k)``: the ``k`` largest-magnitude entries (ties to the lower index) as
  sorted indices and their values; ``topk_decompress`` scatters them back.
- ``softmax_cross_entropy(logits, target, ignore_index)``: mean loss and its gradient in one
  call, for (rows, classes) logits and integer targets.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple

import numpy as np

from .numba_backend import compiled

# the files its cached machine code is built from (``numba_backend``): itself, and the njit
# options of ``numba_backend``; ``kernels.validate`` serves the Python side only, listed since
# the check of these lists reads the imports
BUILT_FROM = ("numba_kernels", "numba_backend", "kernels.validate")

# kernel -> largest input (elements: per slot, of the source, of the gradient, of the logits)
# for which the Numba form runs; 0: never, None: no limit. Set from bench_numba.py runs on a
# shared 2-core x86-64 (Zen 4) machine; NumPy time / Numba time in brackets.
NUMBA_LIMITS = {
    # 1-4 KiB slots: p=4 [1.8-2.0], p=2 [0.99-1.05]; 128-512 KiB [0.91-1.22]; 16 MiB [0.70]
    "reduce_sum": 1024,
    # 256 KiB [3.0-4.0], 4 MiB [2.5-3.9], 64 MiB [3.3-3.9]: NumPy 2.4 casts element by element
    "cast_float16": None,
    # 64K [0.69-0.85], 1M [0.67-1.41], 4M [0.61-1.05]: no consistent gain
    "topk": 0,
    # 64x10 [8.2-8.7], 512x10 [3.4-3.7], 64x100 [1.6-2.2], 128x100 [1.1-1.3]; 512x100 [0.97]
    "cross_entropy": 16384,
}
_BLOCK = 4096  # elements per block of the slot reduction: 4 slots of float32 stay in L1/L2
_NUMBA_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int32),
                 np.dtype(np.int64))


# ----- reduction of p slots ------------------------------------------------------------------
@compiled
def _reduce_sum_numba(out, slots):  # pragma: no cover - runs compiled
    # Slicing each block first (instead of indexing range(start, stop)) lets LLVM vectorise.
    n, count = out.shape[0], len(slots)
    for start in range(0, n, _BLOCK):
        width = min(_BLOCK, n - start)
        acc = out[start:start + width]
        first, second = slots[0][start:start + width], slots[1][start:start + width]
        for i in range(width):
            acc[i] = first[i] + second[i]
        for j in range(2, count):
            other = slots[j][start:start + width]
            for i in range(width):
                acc[i] += other[i]


def reduce_sum_into_numpy(out: np.ndarray, slots: Sequence[np.ndarray]) -> np.ndarray:
    np.add(slots[0], slots[1], out=out)
    for other in slots[2:]:
        np.add(out, other, out=out)
    return out


def reduce_sum_into(out: np.ndarray, slots: Sequence[np.ndarray]) -> np.ndarray:
    """``out[:] = slots[0] + slots[1] + ...`` summed left to right (the order NumPy's chain of
    ``np.add`` uses, so results are bit-identical); 1-D arrays of one dtype and length."""
    if len(slots) < 2:
        raise ValueError(f"reduce_sum_into needs at least 2 slots, got {len(slots)}")
    for i, s in enumerate(slots):
        if s.shape != out.shape or s.dtype != out.dtype or s.ndim != 1:
            raise ValueError(f"slot {i} has shape {s.shape} and dtype {s.dtype}; out has "
                             f"{out.shape} and {out.dtype} (1-D, equal in all slots)")
    if (_use("reduce_sum", out.size) and out.dtype in _NUMBA_DTYPES and out.flags.c_contiguous
            and all(s.flags.c_contiguous for s in slots)):
        _reduce_sum_numba(out, tuple(slots))
        return out
    return reduce_sum_into_numpy(out, slots)


# ----- float32 -> float16 --------------------------------------------------------------------
@compiled
def _float16_bits_numba(src, out):  # pragma: no cover - runs compiled
    # IEEE binary32 -> binary16 bit patterns, round to nearest even (NumPy's halffloat rules).
    for i in range(src.shape[0]):
        f = np.int64(src[i])
        sign = (f >> 16) & 0x8000
        f_exp = f & 0x7F800000
        f_sig = f & 0x007FFFFF
        if f_exp >= 0x47800000:  # overflow, inf or NaN
            if f_exp == 0x7F800000 and f_sig != 0:
                h = 0x7C00 + (f_sig >> 13)
                out[i] = sign + (h + 1 if h == 0x7C00 else h)  # keep NaN a NaN
            else:
                out[i] = sign + 0x7C00
        elif f_exp <= 0x38000000:  # subnormal half or signed zero
            if f_exp < 0x33000000:
                out[i] = sign
            else:
                sig = (0x00800000 + f_sig) >> (113 - (f_exp >> 23))
                if (sig & 0x3FFF) != 0x1000 or (f & 0x7FF) != 0:
                    sig += 0x1000
                out[i] = sign + (sig >> 13)
        else:
            if (f_sig & 0x3FFF) != 0x1000:
                f_sig += 0x1000
            out[i] = sign + (((f_exp - 0x38000000) >> 13) + (f_sig >> 13))


def cast_to_float16(src: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """``src`` (float32) rounded to float16, into ``out`` when given (same shape)."""
    if src.dtype != np.float32:
        raise TypeError(f"cast_to_float16 takes float32, got {src.dtype}")
    if out is None:
        out = np.empty(src.shape, dtype=np.float16)
    elif out.shape != src.shape or out.dtype != np.float16:
        raise ValueError(f"out has shape {out.shape} and dtype {out.dtype}; expected "
                         f"{src.shape} float16")
    if _use("cast_float16", src.size) and src.flags.c_contiguous and out.flags.c_contiguous:
        _float16_bits_numba(src.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16))
    else:
        with np.errstate(over="ignore"):  # overflow to inf is the defined result, as in Numba's
            np.copyto(out, src, casting="same_kind")
    return out


# ----- top-k gradient compression ------------------------------------------------------------
@compiled
def _topk_numba(grad, k):  # pragma: no cover - runs compiled
    n = grad.shape[0]
    magnitude = np.abs(grad)
    threshold = np.partition(magnitude, n - k)[n - k]
    above = 0
    for i in range(n):
        if magnitude[i] > threshold:
            above += 1
    ties = k - above
    indices = np.empty(k, dtype=np.int64)
    values = np.empty(k, dtype=grad.dtype)
    taken = 0
    for i in range(n):
        m = magnitude[i]
        if m > threshold or (m == threshold and ties > 0):
            if not m > threshold:
                ties -= 1
            if taken < k:
                indices[taken] = i
                values[taken] = grad[i]
            taken += 1
    return indices, values, taken


def _topk_numpy(grad: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray, int]:
    magnitude = np.abs(grad)
    threshold = np.partition(magnitude, grad.size - k)[grad.size - k]
    above = np.flatnonzero(magnitude > threshold)
    ties = np.flatnonzero(magnitude == threshold)[:k - above.size]
    indices = np.sort(np.concatenate([above, ties]))
    return indices, grad[indices], int(indices.size)


def topk_compress(grad: np.ndarray, k: int) -> Tuple[np.ndarray, np.ndarray]:
    """(indices, values) of the ``k`` entries of 1-D ``grad`` with the largest magnitude;
    indices ascending, ties resolved towards the lower index. NaN raises ValueError."""
    if grad.ndim != 1 or grad.dtype.kind != "f":
        raise ValueError(f"topk_compress takes a 1-D floating array, got shape {grad.shape} "
                         f"and dtype {grad.dtype}")
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 0 <= k <= grad.size:
        raise ValueError(f"k must be an integer in [0, {grad.size}], got {k!r}")
    k = int(k)
    if k == 0:
        return np.empty(0, np.int64), np.empty(0, grad.dtype)
    if _use("topk", grad.size) and grad.dtype in _NUMBA_DTYPES:
        indices, values, found = _topk_numba(grad, k)
    else:
        indices, values, found = _topk_numpy(grad, k)
    if found != k:  # NaN compares false with everything, so it is neither kept nor skipped
        raise ValueError(f"topk_compress: gradient of {grad.size} elements holds NaN; picked "
                         f"{found} of k={k}")
    return indices, values


def topk_decompress(indices: np.ndarray, values: np.ndarray, size: int) -> np.ndarray:
    """The dense 1-D array of ``size`` zeros with ``values`` at ``indices``."""
    if indices.shape != values.shape:
        raise ValueError(f"indices shape {indices.shape} differs from values shape "
                         f"{values.shape}")
    dense = np.zeros(size, dtype=values.dtype)
    dense[indices] = values
    return dense


# ----- fused softmax cross-entropy ------------------------------------------------------------
@compiled
def _cross_entropy_numba(logits, target, ignore_index, grad):  # pragma: no cover - compiled
    rows, classes = logits.shape
    count = 0
    for r in range(rows):
        if target[r] != ignore_index:
            count += 1
    scale = 1.0 / count if count else 0.0
    total = 0.0
    for r in range(rows):
        t = target[r]
        if t == ignore_index:
            grad[r, :] = 0.0
            continue
        row, out = logits[r], grad[r]
        peak = row[0]
        for j in range(1, classes):
            peak = max(peak, row[j])
        s = 0.0
        for j in range(classes):
            e = np.exp(row[j] - peak)
            out[j] = e
            s += e
        total += peak + np.log(s) - row[t]
        factor = scale / s
        for j in range(classes):
            out[j] *= factor
        out[t] -= scale
    return total * scale if count else np.nan


def _cross_entropy_numpy(logits, target, ignore_index, grad):
    rows = np.arange(logits.shape[0])
    valid = target != ignore_index
    count = int(valid.sum())
    t = np.where(valid, target, 0)
    z = logits - logits.max(axis=1, keepdims=True)
    picked = z[rows, t]
    e = np.exp(z, out=z)
    s = e.sum(axis=1)
    loss = float(np.where(valid, np.log(s) - picked, 0).sum() / count) if count else np.nan
    scale = 1.0 / count if count else 0.0
    np.multiply(e, (np.where(valid, scale, 0.0) / s)[:, None], out=grad)
    grad[rows, t] -= np.where(valid, scale, 0.0)
    return loss


def softmax_cross_entropy(logits: np.ndarray, target: np.ndarray,
                          ignore_index: int = -100) -> Tuple[float, np.ndarray]:
    """(mean loss over non-ignored rows, d loss / d logits) for float (rows, classes) logits
    and integer targets (rows,). All rows ignored: loss NaN, gradient zero (as PyTorch)."""
    from .kernels import validate
    rows, classes = validate.class_targets("softmax_cross_entropy", logits, target)
    validate.target_values("softmax_cross_entropy", target, classes, ignore_index)
    grad = np.empty(logits.shape, dtype=logits.dtype)
    if rows == 0:
        return float("nan"), grad
    if _use("cross_entropy", logits.size) and logits.dtype in _NUMBA_DTYPES[:2]:
        loss = _cross_entropy_numba(np.ascontiguousarray(logits),
                                    np.ascontiguousarray(target, dtype=np.int64),
                                    int(ignore_index), grad)
    else:
        loss = _cross_entropy_numpy(logits, target, ignore_index, grad)
    return float(loss), grad


_KERNELS = {"reduce_sum": _reduce_sum_numba, "cast_float16": _float16_bits_numba,
            "topk": _topk_numba, "cross_entropy": _cross_entropy_numba}


def _use(name: str, size: int) -> bool:
    limit = NUMBA_LIMITS[name]
    return _KERNELS[name] is not None and (limit is None or size <= limit)


def form_in_use(name: str, size: int) -> str:
    """"numba" or "numpy": which form kernel ``name``'s public function runs for ``size``."""
    if name not in NUMBA_LIMITS:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(NUMBA_LIMITS)}")
    return "numba" if _use(name, size) else "numpy"


__all__ = ["NUMBA_LIMITS", "cast_to_float16", "form_in_use", "reduce_sum_into",
           "reduce_sum_into_numpy", "softmax_cross_entropy", "topk_compress", "topk_decompress"]
