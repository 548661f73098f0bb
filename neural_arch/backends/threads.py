"""``set_num_threads`` / ``get_num_threads``: torch's names for the size of the thread pool
that does the heavy arithmetic. Here that is the BLAS library under NumPy (matrix products,
convolutions as matrix products), which ``threadpoolctl`` resizes in the running process;
threadpoolctl comes with scikit-learn, a dependency of the framework.

Without threadpoolctl the running pool cannot be resized: the number is then written to the
usual environment variables, which only processes started afterwards (data-loader workers,
launched ranks) read, and a RuntimeWarning says so.
"""
from __future__ import annotations

import numbers
import os
import warnings
from types import ModuleType
from typing import Any, Optional

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")
_requested: Optional[int] = None  # the last number set, for when no pool can be asked


def _check(threads: Any) -> int:
    # torch's checks and messages
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        raise RuntimeError(f"set_num_threads expects an int, but got "
                           f"{type(threads).__name__}")
    if threads <= 0:
        raise RuntimeError(f"set_num_threads expects a positive integer, got {threads}")
    return int(threads)


def threadpool_controller() -> Optional[ModuleType]:
    """The ``threadpoolctl`` module, or None when it is not installed (imported on first use:
    it costs an import of ctypes and a scan of the loaded libraries)."""
    try:
        import threadpoolctl
    except ImportError:
        return None
    return threadpoolctl


def _blas_pools() -> list:
    controller = threadpool_controller()
    if controller is None:
        return []
    return [info for info in controller.threadpool_info() if info["user_api"] == "blas"]


def set_num_threads(threads: int) -> None:
    """Use ``threads`` threads in NumPy's BLAS from now on, in this process."""
    global _requested
    _requested = _check(threads)
    controller = threadpool_controller()
    if controller is None:
        for name in THREAD_VARIABLES:
            os.environ[name] = str(_requested)
        warnings.warn(f"set_num_threads({threads}): threadpoolctl is not installed, so the "
                      f"running BLAS pool keeps its size; {', '.join(THREAD_VARIABLES)} are "
                      f"set for processes started from now on", RuntimeWarning, stacklevel=2)
        return
    controller.threadpool_limits(limits=_requested, user_api="blas")


def get_num_threads() -> int:
    """The size of NumPy's BLAS pool (the largest, if several BLAS libraries are loaded)."""
    pools = _blas_pools()
    if pools:
        return int(max(info["num_threads"] for info in pools))
    if _requested is not None:
        return _requested
    for name in THREAD_VARIABLES:
        value = os.environ.get(name, "")
        if value.strip().isdigit() and int(value) > 0:
            return int(value)
    return os.cpu_count() or 1


__all__ = ["THREAD_VARIABLES", "get_num_threads", "set_num_threads"]
