"""Adam's and AdamW's update of one CPU parameter as a Numba kernel: one pass over memory.

The NumPy form in ``neural_arch.optim.adam`` makes about a dozen passes over the parameter,
its gradient and both moments (each operation reads and writes whole arrays, and half of them
allocate a temporary); this loop reads each element once and writes three. It performs the
same operations in the same order and rounding (no fast-math flags, scalars in the array's
dtype), so its results equal the NumPy form's bit for bit.

``update`` returns False when it does not apply (Numba absent or switched off with
``NEURAL_ARCH_NUMBA=0``, a dtype other than float32/float64, arrays that differ in dtype or
shape, or are not C-contiguous): the caller then runs its NumPy form.
"""
from __future__ import annotations

import numpy as np

from .numba_backend import compiled

# the files its cached machine code is built from (``numba_backend``): itself, and the njit
# options of ``numba_backend``
BUILT_FROM = ("adam_kernels", "numba_backend")

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


# error_model="numpy": a division by zero gives inf/NaN as in NumPy instead of raising, which
# also lets LLVM vectorise the loop (Python's model checks every divisor).
@compiled(error_model="numpy")
def _adam_step(data, grad, exp_avg, exp_avg_sq, decay, l2, one_minus_beta1, beta2,
               one_minus_beta2, bias_correction2_sqrt, eps, step_size):  # pragma: no cover
    # decay: the decoupled factor 1 - lr * wd (1 for Adam); l2: Adam's wd added to the
    # gradient (0 for AdamW). Each line is one whole-array operation of the NumPy form.
    for i in range(data.shape[0]):
        p = data[i] * decay
        g = grad[i]
        if l2 != 0:  # a branch, not g + 0 * p: that would turn an infinite p into NaN
            g = g + l2 * p
        m = exp_avg[i] + (g - exp_avg[i]) * one_minus_beta1
        v = exp_avg_sq[i] * beta2 + one_minus_beta2 * (g * g)
        exp_avg[i] = m
        exp_avg_sq[i] = v
        data[i] = p - step_size * (m / (np.sqrt(v) / bias_correction2_sqrt + eps))


def available() -> bool:
    """Whether the compiled kernel runs (Numba installed and not switched off)."""
    return _adam_step is not None


def update(data: np.ndarray, grad: np.ndarray, exp_avg: np.ndarray, exp_avg_sq: np.ndarray,
           *, decay: float, l2: float, beta1: float, beta2: float,
           bias_correction2_sqrt: float, eps: float, step_size: float) -> bool:
    """One Adam step of ``data`` in place (moments updated too); False if it does not apply."""
    if _adam_step is None or not isinstance(data, np.ndarray):
        return False
    dtype = data.dtype
    arrays = (data, grad, exp_avg, exp_avg_sq)
    if dtype not in DTYPES or data.size == 0:
        return False
    for array in arrays:
        if (not isinstance(array, np.ndarray) or array.dtype != dtype
                or array.shape != data.shape or not array.flags.c_contiguous):
            return False
    cast = dtype.type
    flat = [array.reshape(-1) for array in arrays]  # views: every array is C-contiguous
    _adam_step(*flat, cast(decay), cast(l2), cast(1 - beta1), cast(beta2), cast(1 - beta2),
               cast(bias_correction2_sqrt), cast(eps), cast(step_size))
    return True


__all__ = ["DTYPES", "available", "update"]
