"""Receive buffers kept per thread between collective calls.

A fresh buffer of several MiB costs a page fault per 4 KiB page on every call, about as long as
receiving into it; one kept per thread is grown when a call needs more and never shrunk. The
ring (``algorithms.ring``), the tree's reduce, gather and scatter (``algorithms.tree``) and
the mpi transport's two-rank all-reduce (``transports.mpi_pair``) share it: a call uses it only
until it returns, and none runs inside another.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

_held = threading.local()


def thread_scratch(nbytes: int, dtype: Any) -> np.ndarray:
    """This thread's scratch buffer: ``nbytes`` of it, as ``dtype``."""
    held = getattr(_held, "buf", None)
    if held is None or held.nbytes < nbytes:
        held = _held.buf = np.empty(nbytes, np.uint8)
    return held[:nbytes].view(dtype)
