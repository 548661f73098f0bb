"""glibc allocator settings for training loops (Linux only; ``NEURAL_ARCH_TUNE_MALLOC=0`` skips).

A training step frees and re-allocates the same multi-megabyte arrays (activations, gradients)
every iteration. With glibc's defaults such blocks are returned to the OS on free (``munmap`` or
heap trimming) and page-faulted back in on the next allocation, which costs 10-20% of a small
MLP step. Serving blocks up to 32 MiB from the heap and trimming it only past 256 MiB of free
space keeps those pages mapped for reuse.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 * 1024 * 1024
TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024

_applied = False


def tune_allocator() -> bool:
    """Apply the settings once per process; returns True when they are in effect."""
    global _applied
    if _applied:
        return True
    if os.environ.get("NEURAL_ARCH_TUNE_MALLOC", "1") == "0":
        return False
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    _applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))
    return _applied
