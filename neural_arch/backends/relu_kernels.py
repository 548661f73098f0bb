"""ReLU over C-contiguous NumPy float arrays as Numba kernels: one pass each way.

NumPy's form makes the backward two passes with a temporary (``out > 0`` as a boolean array,
then ``g * mask``); here one pass reads the gradient and the saved output and writes the input
gradient. The rules are torch's: the output is ``x`` where ``x > 0`` or ``x`` is NaN, else 0;
the gradient is ``g`` where the output is not ``<= 0`` (so a NaN input passes its gradient)
and exactly 0 elsewhere, also when ``g`` is infinite or NaN (NumPy's product gives NaN there).
Importing this module imports Numba; ``available()`` is False without it or with
``NEURAL_ARCH_NUMBA=0``.
"""
from __future__ import annotations

import numpy as np

from .numba_backend import compiled

# the files its cached machine code is built from (``numba_backend``): itself, and the njit
# options of ``numba_backend``
BUILT_FROM = ("relu_kernels", "numba_backend")

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


@compiled
def _forward(x, out):  # pragma: no cover - runs compiled
    for i in range(x.shape[0]):
        v = x[i]
        out[i] = 0 if v <= 0 else v


@compiled
def _backward(g, out, gx):  # pragma: no cover - runs compiled
    for i in range(g.shape[0]):
        gx[i] = 0 if out[i] <= 0 else g[i]


def available() -> bool:
    """True when the kernels run (Numba installed and not switched off)."""
    return _forward is not None and _backward is not None


def takes(x: np.ndarray) -> bool:
    """Whether ``x`` suits the kernels: a non-empty C-contiguous float32/float64 array."""
    return x.dtype in DTYPES and x.size > 0 and x.flags.c_contiguous


def forward(x: np.ndarray) -> np.ndarray:
    """relu(x) for an array ``takes`` accepts."""
    out = np.empty_like(x)
    _forward(x.reshape(-1), out.reshape(-1))
    return out


def backward(g: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The input gradient from the output gradient ``g`` and the saved output ``out``; a
    gradient the kernel does not take (strided, broadcast, another shape or kind) is
    masked with NumPy, which differs only where ``g`` is infinite or NaN."""
    if type(g) is np.ndarray and g.shape == out.shape and takes(g):
        gx = np.empty_like(g)
        _backward(g.reshape(-1), out.reshape(-1), gx.reshape(-1))
        return gx
    return g * ((out > 0) | (out != out))
