"""Erf and exact GELU as Numba kernels: one pass over memory where NumPy makes about twenty.

``special`` evaluates its polynomial fits as chains of whole-array operations, each a pass over
memory (about 8 ms for the 16 x 64 x 512 float32 activation of a small GPT). These kernels
evaluate the same fits element by element, and LLVM vectorises the loops. Numba's exp is a
scalar libm call (it has no vector math library without Intel's SVML), so float32 uses its own
exp written in vectorisable arithmetic: float32 erf then costs about what NumPy's exp does.
``fastmath`` is limited to contraction (fused multiply-add): the other fast-math flags would
drop the NaN and infinity semantics.

GELU's kernel also writes the derivative its backward multiplies by, ``Phi(x) + x phi(x)``,
reusing the forward's exp: with z = x / sqrt(2), exp(-z^2) is both the factor of erf's tail
and sqrt(2 pi) phi(x). The backward is then a single multiply.

Float32 runs in float32 with special's float32 fits, float64 in float64 with its float64 fits
(``special`` states the accuracy of each); other floats go through float32. Importing this
module imports Numba; ``available()`` is False without it or with ``NEURAL_ARCH_NUMBA=0``.
"""
from __future__ import annotations

import math
from typing import Optional, Tuple

import numpy as np

from . import special
from .numba_backend import compiled, inlined

# the files its cached machine code is built from (``numba_backend``): itself, the njit options
# of ``numba_backend``, and ``special``'s fits, frozen in as constants
BUILT_FROM = ("erf_kernels", "numba_backend", "special")


def _constants(dtype: np.dtype) -> tuple:
    """(small fit, large fit, scalars) in ``dtype``, so that no float64 literal promotes the
    float32 kernels to float64 (Numba types a Python float as float64)."""
    cast = dtype.type
    precision = 8 if dtype.itemsize == 8 else 4
    split, limit = special._SPLIT, special._LIMIT
    scalars = (split, limit, 2.0 / (split * split), 1.0 / limit,
               2.0 / (1.0 / split - 1.0 / limit), 1.0, 0.5, special.SQRT_HALF,
               special.INV_SQRT_2PI)
    return (tuple(cast(c) for c in special._SMALL[precision]),
            tuple(cast(c) for c in special._LARGE[precision]), tuple(cast(c) for c in scalars))


_SMALL32, _LARGE32, _C32 = _constants(np.dtype(np.float32))
_SMALL64, _LARGE64, _C64 = _constants(np.dtype(np.float64))


@inlined
def _erf_of(z, e, small, large, c):  # pragma: no cover - runs compiled
    # erf(z) given e = exp(-z*z), the same two fits as special.erf; both sides are computed
    # and one is selected, so the loop has no branch to stop vectorisation. A NaN z gives a
    # NaN e, and so a NaN; |z| = inf gives e = 0, and so +-1.
    split, limit, s_scale, u_offset, u_scale, one = c[0], c[1], c[2], c[3], c[4], c[5]
    a = abs(z)
    lo = min(a, split)
    s = lo * lo * s_scale - one
    p = small[len(small) - 1]
    for k in range(len(small) - 2, -1, -1):
        p = p * s + small[k]
    hi = min(max(a, split), limit)
    u = (one / hi - u_offset) * u_scale - one
    q = large[len(large) - 1]
    for k in range(len(large) - 2, -1, -1):
        q = q * u + large[k]
    r = lo * p if a < split else one - q * e
    return math.copysign(r, z)


@inlined
def _gelu_of(v, z, e, small, large, c):  # pragma: no cover - runs compiled
    # (x * Phi(x), Phi(x) + x * phi(x)) of x = v, given z = x / sqrt(2) and e = exp(-z*z)
    cdf = c[6] + c[6] * _erf_of(z, e, small, large, c)
    return v * cdf, cdf + v * (e * c[8])


# ----- exp(y) for float32 y <= 0 that LLVM vectorises -------------------------------------------
# Without SVML, math.exp is a scalar libm call per element, most of a kernel's time. Here
# exp(y) = 2^n exp(r) with n = round(y / ln 2) and r = y - n ln 2 (ln 2 in two parts, so that
# n * _LN2_HI is exact), exp(r) by its Taylor polynomial of degree 7 (|r| <= ln(2) / 2: error
# under 1e-8 relative, below float32's rounding), 2^n built from its exponent bits. Below
# ln(FLT_MIN) the result, a subnormal or 0, is 0: it only ever multiplies a tail that float32
# rounds away. A NaN stays a NaN (r is NaN).
_LOG2E32, _LN2_HI32, _LN2_LO32 = np.float32(1.0 / math.log(2.0)), np.float32(0.693359375), \
    np.float32(-2.12194440e-4)
_EXP_MIN32 = np.float32(math.log(float(np.finfo(np.float32).tiny)))
_TAYLOR32 = tuple(np.float32(1.0 / math.factorial(k)) for k in range(8))
_ZERO32, _HALF32 = np.float32(0.0), np.float32(0.5)


def _bitcast_intrinsic():
    """An int32 -> float32 reinterpretation for compiled code (None without Numba)."""
    from .numba_backend import is_available
    if not is_available():
        return None
    from llvmlite import ir
    from numba.core import types
    from numba.extending import intrinsic

    @intrinsic
    def float32_from_bits(typingctx, bits):
        def codegen(context, builder, signature, args):
            return builder.bitcast(args[0], ir.FloatType())
        return types.float32(types.int32), codegen

    return float32_from_bits


_float32_from_bits = _bitcast_intrinsic()


@inlined
def _exp32(y):  # pragma: no cover - runs compiled
    w = max(y, _EXP_MIN32)
    n = np.floor(w * _LOG2E32 + _HALF32)  # np.floor stays float32 (math.floor gives int64)
    r = w - n * _LN2_HI32 - n * _LN2_LO32
    p = _TAYLOR32[7]
    for k in range(6, -1, -1):
        p = p * r + _TAYLOR32[k]
    scale = _float32_from_bits(np.int32((np.int32(n) + np.int32(127)) << np.int32(23)))
    return _ZERO32 if y < _EXP_MIN32 else p * scale


exp_nonpositive32 = _exp32  # for the other kernels (softmax) that exponentiate x - max(x)


# One kernel per dtype: the fits are module globals, which Numba freezes into constants; passed
# as tuple arguments instead they are indexed at run time and the loops do not vectorise.
# Float64 keeps libm's exp (full precision; float64 is not the training hot path).
_FAST = {"fastmath": {"contract"}}


@compiled(**_FAST)
def _erf32(x, out):  # pragma: no cover - runs compiled
    for i in range(x.shape[0]):
        out[i] = _erf_of(x[i], _exp32(-(x[i] * x[i])), _SMALL32, _LARGE32, _C32)


@compiled(**_FAST)
def _erf64(x, out):  # pragma: no cover - runs compiled
    for i in range(x.shape[0]):
        out[i] = _erf_of(x[i], math.exp(-(x[i] * x[i])), _SMALL64, _LARGE64, _C64)


@compiled(**_FAST)
def _gelu32(x, out, derivative):  # pragma: no cover - runs compiled
    for i in range(x.shape[0]):
        z = x[i] * _C32[7]
        out[i], derivative[i] = _gelu_of(x[i], z, _exp32(-(z * z)), _SMALL32, _LARGE32, _C32)


@compiled(**_FAST)
def _gelu64(x, out, derivative):  # pragma: no cover - runs compiled
    for i in range(x.shape[0]):
        z = x[i] * _C64[7]
        out[i], derivative[i] = _gelu_of(x[i], z, math.exp(-(z * z)), _SMALL64, _LARGE64,
                                         _C64)


@compiled(**_FAST)
def _gelu32_forward(x, out):  # pragma: no cover - runs compiled
    for i in range(x.shape[0]):
        z = x[i] * _C32[7]
        out[i] = _gelu_of(x[i], z, _exp32(-(z * z)), _SMALL32, _LARGE32, _C32)[0]


@compiled(**_FAST)
def _gelu64_forward(x, out):  # pragma: no cover - runs compiled
    for i in range(x.shape[0]):
        z = x[i] * _C64[7]
        out[i] = _gelu_of(x[i], z, math.exp(-(z * z)), _SMALL64, _LARGE64, _C64)[0]


_KERNELS = {np.dtype(np.float32): (_erf32, _gelu32, _gelu32_forward),
            np.dtype(np.float64): (_erf64, _gelu64, _gelu64_forward)}


def available() -> bool:
    """True when the kernels run (Numba installed and not switched off)."""
    return all(k is not None for kernels in _KERNELS.values() for k in kernels)


def _flat_input(x: np.ndarray, name: str) -> Tuple[np.ndarray, tuple]:
    """``x`` as a contiguous 1-D array of float32 or float64 (a copy only when it is not one
    already) and the kernels of that dtype."""
    if x.dtype.kind != "f":
        raise TypeError(f"{name} needs a floating array, got dtype {x.dtype}")
    work = x if x.dtype in _KERNELS else x.astype(np.float32)
    flat = np.ascontiguousarray(work).reshape(-1)
    return flat, _KERNELS[flat.dtype]


def _restore(result: np.ndarray, x: np.ndarray) -> np.ndarray:
    result = result.reshape(x.shape)
    return result if result.dtype == x.dtype else result.astype(x.dtype)


def erf(x: np.ndarray) -> np.ndarray:
    """Elementwise error function of a floating array; keeps the dtype and shape."""
    flat, kernels = _flat_input(x, "erf")
    out = np.empty_like(flat)
    kernels[0](flat, out)
    return _restore(out, x)


def gelu(x: np.ndarray, with_derivative: bool) -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """Exact GELU ``x * Phi(x)`` and, if ``with_derivative``, ``Phi(x) + x * phi(x)`` (else
    None); as ``special.gelu``, in one pass."""
    flat, kernels = _flat_input(x, "gelu")
    out = np.empty_like(flat)
    if not with_derivative:
        kernels[2](flat, out)
        return _restore(out, x), None
    derivative = np.empty_like(flat)
    kernels[1](flat, out, derivative)
    return _restore(out, x), _restore(derivative, x)
