"""The prepared small all-reduce, compiled once it runs often.

On a 4-byte vector the Python of ``shm_prepared.all_reduce`` costs several times its barrier:
writing the signature, arriving, polling, checking the peers and reducing are each a NumPy
scalar or ufunc call. ``shm_numba.small_all_reduce`` takes the same steps on the same words
and areas in one compiled call, so a rank on this path and a rank on the Python one meet in the
same generation and end with the same bits: sums and products in rank order in the vector's
dtype, and a mean through float64 (one rounding of the exact quotient to float32, as NumPy's
float32 division gives, since float64 carries more than twice float32's precision).

Everything rare stays in Python: writing the full header when the fingerprint changes, waking a
peer asleep in the kernel, waiting beyond a short poll (with the timeout and the liveness
checks), naming a mismatch. Compiled: SUM, PRODUCT and AVERAGE of native float32, float64,
int32 and int64; MIN and MAX (NumPy's NaN rules) and float16 stay in Python.

A prepared all-reduce changes over after ``HOT_CALLS`` calls, so a job that makes few never
imports Numba for it (importing it and loading the cached machine code take about half a
second). ``NEURAL_ARCH_SHM_SMALL`` = ``python`` never compiles, ``compiled`` compiles at the
first call, ``auto`` (the default) waits for ``HOT_CALLS``.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from typing import Any, Callable, Dict, Optional

import numpy as np

from ...backends import numba_backend
from ..reduce_ops import ReduceOp
from ..transports import futex
from ..transports.base import Fingerprint
from ..transports.shm import ShmTransport
from .shm_generations import check_open, mismatch, publish, signature

ENV_CHOICE = "NEURAL_ARCH_SHM_SMALL"
CHOICES = ("auto", "python", "compiled")
HOT_CALLS = 32
COMPILED_DTYPES = (np.float32, np.float64, np.int32, np.int64)
COMPILED_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVERAGE)

Run = Callable[[np.ndarray, Fingerprint], None]
_built: Dict[str, Any] = {}  # the kernel module, or why there is none


def choice() -> str:
    value = os.environ.get(ENV_CHOICE, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_CHOICE}={value!r}; use one of {', '.join(CHOICES)}")
    return value


def why_not_compiled() -> str:
    """Why prepared all-reduces stay in Python ('' when they are compiled or not tried yet)."""
    return _built.get("why", "")


def _kernels() -> Optional[Any]:
    """The compiled kernel module, built once, or None (``why_not_compiled()`` says why)."""
    if "module" not in _built:
        if not numba_backend.is_available():
            _built.update(module=None, why=numba_backend.unavailable_reason())
            return None
        try:
            from . import shm_numba
            _check(shm_numba)
            _built.update(module=shm_numba, why="")
        except Exception as exc:  # an LLVM or Numba that cannot build it
            _built.update(module=None, why=f"the compiled small all-reduce failed: {exc!r}")
            warnings.warn(f"{_built['why']}; small shared-memory all-reduces stay in Python",
                          RuntimeWarning)
    return _built["module"]


def _check(kernels: Any) -> None:
    """Compile (or load from Numba's cache) and run one rank's generation on private memory."""
    words = np.zeros(32, np.int64)
    areas = np.zeros((6, 8), np.float32)  # two ranks: rows (half, rank), result rows unused
    areas[1, :3] = [0.5, -2.0, 7.0]  # the peer's input, as if it had arrived
    words[16], words[16 + 1], words[16 + 2] = 1, 99, 5  # peer 1: GEN, SIG0, SEQ0
    buf = np.array([1.0, 2.0, 3.0], np.float32)
    status = kernels.small_all_reduce(buf, words, areas, 0, 2, 99, 5, 4, False, 0.0, False)
    if status != kernels.WAIT or words[0] != 2:
        raise RuntimeError(f"its first generation gave status {status}, arrival {words[0]}")
    words[16] = 2
    status = kernels.small_all_reduce(buf, words, areas, 0, 2, 99, 5, 4, False, 0.0, True)
    if status != 0 or not np.array_equal(buf, [1.5, 0.0, 10.0]):
        raise RuntimeError(f"it reduced to {buf.tolist()} (status {status})")


def _may_compile(dtype: np.dtype, op: ReduceOp) -> bool:
    return (dtype.type in COMPILED_DTYPES and dtype.isnative and op in COMPILED_OPS
            and os.environ.get(numba_backend.ENV_SWITCH, "1").strip() != "0"
            and importlib.util.find_spec("numba") is not None)


def tiered(t: ShmTransport, key: Any, python_run: Run, dtype: np.dtype, n: int,
           op: ReduceOp) -> Run:
    """What ``t.direct_views[key]`` should hold for a prepared all-reduce: ``python_run``, or
    the compiled run (now, or in place of ``python_run`` once it has made HOT_CALLS calls)."""
    mode = choice()
    if mode == "python" or not _may_compile(dtype, op):
        return python_run
    if mode == "compiled":
        return all_reduce(t, dtype, n, op) or python_run
    calls = [0]

    def run(buf: np.ndarray, fp: Fingerprint) -> None:
        python_run(buf, fp)
        calls[0] += 1
        if calls[0] >= HOT_CALLS and t.direct_views.get(key) is run:
            t.direct_views[key] = all_reduce(t, dtype, n, op) or python_run
    return run


def all_reduce(t: ShmTransport, dtype: np.dtype, n: int, op: ReduceOp) -> Optional[Run]:
    """The compiled one-barrier all-reduce of ``n`` elements, or None without the kernel."""
    kernels = _kernels()
    if kernels is None:
        return None
    layout, p, rank, nbytes = t.layout, t.world_size, t.rank, n * dtype.itemsize
    words = t.shared[:layout.rank_headers_at].view(np.int64)
    start = layout.ws_input(0, 0)
    areas = t.shared[start:start + 2 * (p + 1) * layout.workspace_bytes].view(dtype)
    areas = areas.reshape(2 * (p + 1), -1)
    product, divisor = op is ReduceOp.PRODUCT, float(p) if op is ReduceOp.AVERAGE else 0.0
    kernel, watch, signed = kernels.small_all_reduce, t.watch, [None, 0]
    gen_address = t._base_address + 8 * layout.gen_words[rank]

    def run(buf: np.ndarray, fp: Fingerprint) -> None:
        if t._closed:
            check_open(t, fp)  # raises
        key = (fp.op, fp.dtype, fp.count, fp.group)
        if key != signed[0]:
            signed[:] = key, signature(t, fp, nbytes)
        sig, gen = signed[1], t.gen + 1
        if t.header_sigs[gen & 1] != sig:
            publish(t, gen & 1, fp, nbytes, sig)
        # a compiled poll (with pause) takes about as long as a Python one: the same budget
        status = kernel(buf, words, areas, rank, gen, sig, fp.seq, watch.spin_polls, product,
                        divisor, False)
        t.gen = gen
        if status:
            _settle(status, buf, gen, fp, sig)

    def _settle(status: int, buf: np.ndarray, gen: int, fp: Fingerprint, sig: int) -> None:
        if status & kernels.WAKE and futex.AVAILABLE:
            futex.wake(gen_address)
        if status & kernels.WAIT:
            t.wait_arrivals(gen, fp.op, fp.seq)
            status = kernel(buf, words, areas, rank, gen, sig, fp.seq, 0, product, divisor,
                            True)
        if status >= kernels.MISMATCH:
            mismatch(t, gen, fp, status // kernels.MISMATCH - 1)
    return run
