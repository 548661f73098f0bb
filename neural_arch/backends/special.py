"""Special functions written against a generic array namespace ``xp`` (NumPy has no erf).

``erf`` splits the real line in two. For |x| < 1.5, erf(x) = x * P(x^2); for 1.5 <= |x| <= 6,
erf(x) = 1 - exp(-x^2) * Q(1/x), where P and Q are Chebyshev fits converted to power form
(coefficients generated against ``math.erf``). Beyond 6, erfc(x) < 2e-17, so erf is +-1.
Float64 inputs use degree 12/16 fits (max relative error 5e-15); float32 inputs use degree
7/9 fits evaluated in float32 (max relative error 2e-7); other floats are computed in float32.

This is the form for any array namespace; ``erf_kernels`` compiles the same fits into one pass
over memory for NumPy arrays when Numba is installed.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Optional, Tuple

_SPLIT, _LIMIT = 1.5, 6.0
SQRT_HALF = math.sqrt(0.5)
INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)

# erf(x) / x as a polynomial in s = 2 x^2 / 1.5^2 - 1, s in [-1, 1].
_SMALL = {
    8: (0.8168361747839191, -0.22525254703526512, 0.06590879382584061, -0.01628751368688872,
        0.0033850641466018007, -0.0006015928998548254, 9.302925973159264e-05,
        -1.2707945454217107e-05, 1.5529336730935023e-06, -1.7151858224384872e-07,
        1.7282946421849995e-08, -1.636605055881014e-09, 1.4014728862572311e-10),
    4: (0.8168361623409375, -0.22525254086329324, 0.06590919135664747, -0.0162875958580533,
        0.0033830817711571026, -0.0006012978034028435, 9.618441696239616e-05,
        -1.309951010314751e-05),
}
# erfc(x) * exp(x^2) as a polynomial in u = 2 (1/x - 1/6) / (1/1.5 - 1/6) - 1, u in [-1, 1].
_LARGE = {
    8: (0.21849873453703306, 0.11460274749753788, -0.011749767914077702, -8.580232675980985e-05,
        0.0004204258732054143, -0.00011583014936334445, 1.3741542797583002e-05,
        2.6922199462220768e-06, -2.0596839734918375e-06, 6.366707126441563e-07,
        -9.96941052875625e-08, -1.2517140945894914e-08, 1.580832897581111e-08,
        -7.337651536085023e-09, 1.9142977121462444e-09, 2.6960675095078467e-10,
        -2.56079777354877e-10),
    4: (0.21849873444187848, 0.11460274714614727, -0.01174976294120337, -8.579546422512067e-05,
        0.00042038353598914985, -0.00011586718030028246, 1.3871813303483283e-05,
        2.771470742302178e-06, -2.234647663261852e-06, 5.683897480731077e-07),
}


def _horner(coefficients: tuple, s: Any) -> Any:
    result = s * coefficients[-1]
    result += coefficients[-2]
    for c in coefficients[-3::-1]:
        result *= s
        result += c
    return result


def erf(x: Any, xp: Any) -> Any:
    """Error function of a floating array ``x`` using the namespace ``xp``; keeps the dtype."""
    dtype = x.dtype
    if dtype.kind != "f":
        raise TypeError(f"erf needs a floating array, got dtype {dtype}")
    work = x if dtype.itemsize in (4, 8) else x.astype(xp.float32)
    precision = 8 if work.dtype.itemsize == 8 else 4
    magnitude = xp.abs(work)
    small = xp.minimum(magnitude, _SPLIT)
    s = small * small
    s *= 2.0 / (_SPLIT * _SPLIT)
    s -= 1.0
    inner = small * _horner(_SMALL[precision], s)
    large = xp.clip(magnitude, _SPLIT, _LIMIT)
    u = 1.0 / large
    u -= 1.0 / _LIMIT
    u *= 2.0 / (1.0 / _SPLIT - 1.0 / _LIMIT)
    u -= 1.0
    tail = _horner(_LARGE[precision], u)
    tail *= xp.exp(-(large * large))
    outer = 1.0 - tail
    result = xp.where(magnitude < _SPLIT, inner, outer)
    result = xp.copysign(result, work)
    return result if result.dtype == dtype else result.astype(dtype)


def gelu(x: Any, xp: Any, with_derivative: bool,
         erf_fn: Optional[Callable[[Any], Any]] = None) -> Tuple[Any, Optional[Any]]:
    """Exact GELU ``x * Phi(x)`` of a floating array and, if ``with_derivative``, its derivative
    ``Phi(x) + x * phi(x)`` (what the backward multiplies the gradient by), else None.

    ``erf_fn`` is the backend's erf (this module's when None); both results keep ``x.dtype``."""
    cdf = erf(x * SQRT_HALF, xp) if erf_fn is None else erf_fn(x * SQRT_HALF)
    cdf += 1.0
    cdf *= 0.5
    out = x * cdf
    if not with_derivative:
        return out, None
    derivative = xp.exp(-0.5 * x * x)
    derivative *= INV_SQRT_2PI
    derivative *= x
    derivative += cdf
    return out, derivative
