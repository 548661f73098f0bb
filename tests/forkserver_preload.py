"""Imported once by the forkserver of ``dist_harness`` before it forks any rank: Numba and
its CPU target.

Every rank that runs a compiled kernel (ReLU, softmax cross-entropy, the short collectives,
...) would otherwise load them again on its own, about 0.75 s a process (0.2 s to import
Numba, 0.5 s for the first compile or cache load to register the CPU target's
implementations). Nothing of ``neural_arch`` is compiled or loaded here: each rank still
decides for itself whether to use Numba (``NEURAL_ARCH_NUMBA``, read when it first needs a
kernel), and finds and loads its kernels from Numba's cache as before. Without Numba this
does nothing.
"""
from __future__ import annotations

try:
    from numba.core.registry import cpu_target
except ImportError:
    cpu_target = None
if cpu_target is not None:
    try:
        cpu_target.target_context.refresh()
    except Exception:  # noqa: BLE001 - only a warm-up: a rank that needs it then does it itself
        pass
