"""Reduction loops of the collectives that NumPy runs slowly: float16 sums and the two-rank mean.

**float16.** A float16 reduction adds the float32 values of its operands in float32, in rank
order, divides there for a mean, and rounds once to float16 (round to nearest even; a sum
beyond float16's range, 65504, becomes infinity only if the rounded result is). NCCL reduces
half-precision data the same way. A sum of two operands rounded once is exactly NumPy's
float16 ``np.add`` (float32 holds more than twice float16's precision, so rounding first to
float32 changes nothing), which keeps the ring and recursive doubling, which add two vectors at a
time, bit for bit what they were; with more operands the single rounding is more accurate than
NumPy's rounding after every addition, and the shared-memory all-reduce, which sees all ``p``
operands at once, gets it.

**The mean of two.** ``pair_mean`` is ``(acc + other) * factor`` in one pass in place, for the
two-rank shared-memory all-reduce whose mean otherwise takes a second pass over each round.
Its bits are those of the sum followed by the multiplication (two roundings, as before).

Each function has a Numba form (``compiled_sums``; the ``fast`` extra) and a NumPy form with
the same bits. The Numba form runs when Numba is installed, not switched off with
``NEURAL_ARCH_NUMBA=0``, and passed a check against the NumPy form on its first use, for vectors
of at least ``COMPILED_MIN_ELEMENTS`` (below that a call costs more than NumPy's loop).
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any, Callable, Dict, Optional, Sequence

import numpy as np

COMPILED_MIN_ELEMENTS = 1024
# the switch ``backends.numba_backend`` reads too: this package sits with ``reduce_ops`` among
# the distributed basics, which import nothing else of the package
ENV_SWITCH = "NEURAL_ARCH_NUMBA"
_built: Dict[str, Any] = {}  # the kernel module, or why there is none


def _numba_unavailable() -> str:
    """Why Numba may not be used ('' when it may): switched off, or not installed."""
    if os.environ.get(ENV_SWITCH, "1").strip() == "0":
        return f"switched off by {ENV_SWITCH}=0"
    if "installed" not in _built:
        _built["installed"] = importlib.util.find_spec("numba") is not None
    if not _built["installed"]:
        return "Numba is not installed (the 'fast' extra: pip install numba)"
    return ""


def _numpy_half_sum(out: np.ndarray, operands: Sequence[np.ndarray], divisor: int) -> None:
    acc = operands[0].astype(np.float32)
    # infinities and NaN are defined results, as in the compiled form, which never warns
    with np.errstate(over="ignore", invalid="ignore"):
        for other in operands[1:]:
            np.add(acc, other, out=acc)  # each float16 widened exactly, then a float32 add
        if divisor > 0:
            np.divide(acc, np.float32(divisor), out=acc)
        np.copyto(out, acc, casting="same_kind")


def _check(kernels: Any) -> None:
    """Run every kernel once on values that exercise its roundings (ties, subnormals,
    overflow, infinities, NaN) and compare with the NumPy forms."""
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.standard_normal(200) * 10.0 ** rng.integers(-8, 5, 200),
                             [65504, 65504, -65504, 6e-8, -6e-8, 1e-5, 0.0, -0.0, np.inf,
                              -np.inf, 2049, 2051, 1 / 3, np.nan]]).astype(np.float32)
    halves = [values.astype(np.float16), values[::-1].astype(np.float16),
              np.roll(values, 7).astype(np.float16)]
    for count, mean, factor in ((1, kernels.DIVIDE, 3), (2, 0, 0), (2, kernels.MULTIPLY, 0.5),
                                (3, 0, 0), (3, kernels.DIVIDE, 3)):
        got, want = np.empty_like(halves[0]), np.empty_like(halves[0])
        kernels.half_sum(got.view(np.uint16), tuple(h.view(np.uint16) for h in halves[:count]),
                         mean, np.float32(factor))
        _numpy_half_sum(want, halves[:count], round(1 / factor) if mean == 1 else factor)
        if count == 2:  # and the one-loop form, in place
            pair = halves[0].copy()
            kernels.half_pair(pair.view(np.uint16), halves[1].view(np.uint16), mean,
                              np.float32(factor), True)
            got = got if np.array_equal(got, pair, equal_nan=True) else pair
        if not np.array_equal(got, want, equal_nan=True):
            raise RuntimeError(f"the compiled float16 sum of {count} (mean {mean}, factor "
                               f"{factor}) differs from NumPy's at "
                               f"{np.flatnonzero(got != want)[:5]}")
    got = np.empty(values.size, np.uint16)
    kernels.to_half(values, got)
    with np.errstate(over="ignore"):
        if not np.array_equal(got.view(np.float16), values.astype(np.float16), equal_nan=True):
            raise RuntimeError("the compiled float32 -> float16 cast differs from NumPy's")
    back = np.empty(values.size, np.float32)
    kernels.to_single(halves[0].view(np.uint16), back)
    if not np.array_equal(back, halves[0].astype(np.float32), equal_nan=True):
        raise RuntimeError("the compiled float16 -> float32 cast differs from NumPy's")
    got = halves[0].copy()
    kernels.half_pair_mean(got.view(np.uint16), halves[1].view(np.uint16), np.float32(0.5),
                           False)
    want = np.add(halves[1], halves[0])
    want = (want.astype(np.float32) * np.float32(0.5)).astype(np.float16)
    if not np.array_equal(got, want, equal_nan=True):
        raise RuntimeError("the compiled float16 mean of two differs from NumPy's")
    for dtype in (np.float32, np.float64):
        x, y = values.astype(dtype), np.roll(values, 3).astype(dtype)
        got = x.copy()
        kernels.pair_mean(got, y, dtype(0.5), True)
        if not np.array_equal(got, (x + y) * dtype(0.5), equal_nan=True):
            raise RuntimeError(f"the compiled {np.dtype(dtype).name} mean of two differs")


def kernels() -> Optional[Any]:
    """The checked Numba kernel module, or None (``why_not_compiled()`` says why)."""
    if _numba_unavailable():
        return None  # asked each time: NEURAL_ARCH_NUMBA may change (tests flip it)
    if "module" not in _built:
        try:
            from . import compiled_sums
            with np.errstate(over="ignore", invalid="ignore"):
                _check(compiled_sums)
            _built.update(module=compiled_sums, why="")
        except Exception as exc:  # an LLVM without half conversions, or a wrong result
            _built.update(module=None, why=f"the compiled reductions failed: {exc!r}")
            warnings.warn(f"{_built['why']}; float16 reductions stay in NumPy", RuntimeWarning)
    return _built["module"]


def why_not_compiled() -> str:
    """Why the NumPy forms run ('' when the compiled ones do, or were not needed yet)."""
    return _numba_unavailable() or _built.get("why", "")


def _compiled_for(*arrays: np.ndarray) -> Optional[Any]:
    """The kernels when the arrays are C-contiguous (so ``reshape(-1)`` is a view) and hold
    at least COMPILED_MIN_ELEMENTS each."""
    if arrays[0].size < COMPILED_MIN_ELEMENTS:
        return None
    if not all(a.flags.c_contiguous for a in arrays):
        return None
    return kernels()


def form_in_use(size: int) -> str:
    """"compiled" or "numpy": the form a reduction of ``size`` contiguous elements runs."""
    return "compiled" if size >= COMPILED_MIN_ELEMENTS and kernels() is not None else "numpy"


def _check_halves(out: np.ndarray, operands: Sequence[np.ndarray], what: str) -> None:
    if not operands:
        raise ValueError(f"{what} needs at least one operand")
    for i, a in enumerate([out, *operands]):
        if a.dtype != np.float16 or a.shape != out.shape:
            name = "out" if i == 0 else f"operands[{i - 1}]"
            raise TypeError(f"{what}: {name} has dtype {a.dtype} and shape {a.shape}; every "
                            f"array must be float16 of shape {out.shape}")


def sum_halves(out: np.ndarray, operands: Sequence[np.ndarray], divisor: int = 0) -> None:
    """``out`` (float16) = the operands (float16, one shape) summed left to right in float32,
    divided by ``divisor`` when it is > 0, rounded once. ``out`` may be one of the operands."""
    _check_halves(out, operands, "sum_halves")
    compiled = _compiled_for(out, *operands)
    if compiled is None:
        _numpy_half_sum(out, operands, divisor)
        return
    # a power-of-two divisor multiplies by its reciprocal: the float32 sum of float16 values
    # is never subnormal, so the product is the exact quotient, and a product is cheaper
    mean, factor = 0, np.float32(0)
    if divisor > 0:
        power_of_two = divisor & (divisor - 1) == 0
        mean = compiled.MULTIPLY if power_of_two else compiled.DIVIDE
        factor = np.float32(1.0 / divisor if power_of_two else divisor)
    bits = [a.reshape(-1).view(np.uint16) for a in operands]
    target = out.reshape(-1).view(np.uint16)
    if len(operands) == 2 and (out is operands[0] or out is operands[1]):
        first = out is operands[0]
        compiled.half_pair(target, bits[1] if first else bits[0], mean, factor, first)
    else:
        compiled.half_sum(target, tuple(bits), mean, factor)


def add_halves(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``np.add(x, y, out=out)`` for float16, with the same bits, compiled."""
    sum_halves(out, (x, y))
    return out


def divide_halves(values: np.ndarray, count: int, out: np.ndarray) -> None:
    """``np.divide(values, count, out=out)`` for float16, with the same bits, compiled."""
    sum_halves(out, (values,), count)


def pair_mean(acc: np.ndarray, other: np.ndarray, factor: Any, acc_first: bool) -> None:
    """``acc = (acc + other) * factor`` (``other + acc`` unless ``acc_first``), two roundings
    in the dtype of the float32 or float64 vectors, in one pass where compiled."""
    compiled = _compiled_for(acc, other)
    if (compiled is None or acc.dtype.type not in (np.float32, np.float64)
            or acc.ndim != 1 or other.dtype != acc.dtype or other.shape != acc.shape):
        if acc_first:
            np.add(acc, other, out=acc)
        else:
            np.add(other, acc, out=acc)
        np.multiply(acc, factor, out=acc)
    else:
        compiled.pair_mean(acc, other, acc.dtype.type(factor), acc_first)


def pair_mean_half(acc: np.ndarray, other: np.ndarray, factor: float, acc_first: bool) -> None:
    """``acc = (acc + other) * factor`` for float16 vectors with the bits of ``add_halves``
    followed by a multiplication by ``factor`` (``divide_halves`` by a power of two): two
    roundings to float16, in one compiled pass."""
    _check_halves(acc, (other,), "pair_mean_half")
    compiled = _compiled_for(acc, other)
    if compiled is None:
        add_halves(acc, other, acc) if acc_first else add_halves(other, acc, acc)
        with np.errstate(over="ignore", invalid="ignore"):
            np.copyto(acc, acc.astype(np.float32) * np.float32(factor), casting="same_kind")
    else:
        compiled.half_pair_mean(acc.reshape(-1).view(np.uint16),
                                other.reshape(-1).view(np.uint16), np.float32(factor),
                                acc_first)


def pair_mean_for(dtype: np.dtype) -> Callable[[np.ndarray, np.ndarray, Any, bool], None]:
    """``pair_mean`` for vectors of ``dtype``, chosen once: the compiled kernel itself for
    native float32 and float64, else ``pair_mean``. The caller passes 1-D C-contiguous vectors
    of one length and ``factor`` as a scalar of ``dtype``; ``pair_mean`` checks that on every
    call, a few microseconds of Python in each round of the two-rank AVERAGE.
    Both forms give the same bits at every length (``kernels`` checks the compiled one)."""
    dtype = np.dtype(dtype)
    compiled = (kernels() if dtype.type in (np.float32, np.float64) and dtype.isnative
                else None)
    return pair_mean if compiled is None else compiled.pair_mean


def to_float16(src: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """``src`` (float32) rounded to float16 (ties to even, as NumPy's cast), into ``out``."""
    out = np.empty(src.shape, np.float16) if out is None else out
    if out.shape != src.shape:
        raise ValueError(f"to_float16: out has shape {out.shape}, src {src.shape}")
    compiled = _compiled_for(src, out)
    if compiled is None or src.dtype != np.float32 or out.dtype != np.float16:
        with np.errstate(over="ignore"):
            np.copyto(out, src, casting="same_kind")
    else:
        compiled.to_half(src.reshape(-1), out.reshape(-1).view(np.uint16))
    return out


def to_float32(src: np.ndarray, out: np.ndarray) -> np.ndarray:
    """``out`` (float32) = ``src`` (float16), exactly."""
    if out.shape != src.shape:
        raise ValueError(f"to_float32: out has shape {out.shape}, src {src.shape}")
    compiled = _compiled_for(src, out)
    if compiled is None or src.dtype != np.float16 or out.dtype != np.float32:
        np.copyto(out, src)
    else:
        compiled.to_single(src.reshape(-1).view(np.uint16), out.reshape(-1))
    return out


__all__ = ["COMPILED_MIN_ELEMENTS", "add_halves", "divide_halves", "form_in_use", "kernels",
           "pair_mean", "pair_mean_for", "pair_mean_half", "sum_halves", "to_float16",
           "to_float32", "why_not_compiled"]
