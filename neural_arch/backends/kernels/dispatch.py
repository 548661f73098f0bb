"""Which module of array-level kernels runs on a given array.

Callers above the backends (the fused autograd ops in ``neural_arch.core.fused_kernels``, the
``FusedAdamW`` optimizer) ask here instead of naming CuPy, so the same code runs the CUDA
kernels on GPU arrays and the float64 references on NumPy arrays.
"""
from __future__ import annotations

from typing import Any

from .. import backend_for
from . import reference


def kernels_for(array: Any) -> Any:
    """The module whose functions run on ``array``: CUDA kernels for CuPy, references else."""
    if backend_for(array).name == "cupy":
        # imported here, not above: loading the CUDA kernel module is only worth it for GPU data
        from .. import cupy_kernels
        return cupy_kernels
    return reference


__all__ = ["kernels_for"]
