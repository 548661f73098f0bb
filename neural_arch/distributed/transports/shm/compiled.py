"""The compiled form of a plan (``plans``): small all-reduce, broadcast and all-gather.

On a 4-byte vector the Python form of a plan costs several times its barrier: writing the
signature, arriving, polling, checking the peers, reducing or copying are each a NumPy scalar
or ufunc call. ``kernels`` takes the same steps on the same words and
areas in one compiled call, so a rank on the compiled path and a rank on the Python one meet
in the same generation and end with the same bits. An all-reduce sums or multiplies in rank
order in the vector's dtype, and a mean divides by ``p`` in that dtype (multiplies by ``1/p`` for
a power-of-two ``p``, which rounds the same exact quotient, as ``reduce_ops.averager`` chooses)
in the loop that adds the last rank's vector. Broadcasts and all-gathers copy bytes, so every
dtype is compiled.

Everything rare stays in Python: writing the full header when the fingerprint changes, waking a
peer asleep in the kernel, waiting beyond a short poll (with the timeout and the liveness
checks), naming a mismatch. All-reduces compiled: SUM, PRODUCT and AVERAGE of native float32,
float64, int32 and int64; MIN and MAX (NumPy's NaN rules) and float16 stay in Python.

A plan changes over after ``HOT_CALLS`` calls, so a job that makes few never
imports Numba for it (importing it and loading the cached machine code take about half a
second). ``NEURAL_ARCH_SHM_SMALL`` = ``python`` never compiles, ``compiled`` compiles at the
first call, ``auto`` (the default) waits for ``HOT_CALLS``.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from functools import partial
from typing import Any, Callable, Dict, Optional

import numpy as np

from ....backends import numba_backend
from ...reduce_ops import ReduceOp, averager
from ..base import Fingerprint
from . import futex

ENV_CHOICE = "NEURAL_ARCH_SHM_SMALL"
CHOICES = ("auto", "python", "compiled")
HOT_CALLS = 32
COMPILED_DTYPES = (np.float32, np.float64, np.int32, np.int64)
COMPILED_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVERAGE)

_built: Dict[str, Any] = {}  # the kernel module, or why there is none


def choice() -> str:
    value = os.environ.get(ENV_CHOICE, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{ENV_CHOICE}={value!r}; use one of {', '.join(CHOICES)}")
    return value


def why_not_compiled() -> str:
    """Why prepared collectives stay in Python ('' when they are compiled or not tried yet)."""
    return _built.get("why", "")


def _kernels() -> Optional[Any]:
    """The compiled kernel module, built once, or None (``why_not_compiled()`` says why)."""
    if "module" not in _built:
        if not numba_backend.is_available():
            _built.update(module=None, why=numba_backend.unavailable_reason())
            return None
        try:
            from . import kernels
            _check(kernels)
            _built.update(module=kernels, why="")
        except Exception as exc:  # an LLVM or Numba that cannot build it
            _built.update(module=None, why=f"the compiled small collectives failed: {exc!r}")
            warnings.warn(f"{_built['why']}; small shared-memory collectives stay in Python",
                          RuntimeWarning)
    return _built["module"]


def _check(kernels: Any) -> None:
    """Compile (or load from Numba's cache) each kernel and run it as rank 0 of two on private
    memory: the peer, rank 1, has published its input and signature at generation 2."""
    def peer_arrived(arrived: bool) -> np.ndarray:
        words = np.zeros(32, np.int64)
        words[16], words[17], words[18] = 2 if arrived else 1, 99, 5  # rank 1: GEN, SIG0, SEQ0
        return words

    def expect(what: str, got: Any, want: Any) -> None:
        if got != want:
            raise RuntimeError(f"{what} gave {got!r}, not {want!r}")

    areas = np.zeros((6, 8), np.float32)  # rows (half, rank); the result rows stay unused
    areas[1, :3] = [0.5, -2.0, 7.0]
    buf, words = np.array([1.0, 2.0, 3.0], np.float32), peer_arrived(False)
    zero = np.float32(0)
    status = kernels.small_all_reduce(words, areas, 0, False, 0, zero, buf, 2, 99, 5, 4, False)
    expect("the all-reduce before the peer arrived", (status, words[0]), (kernels.WAIT, 2))
    status = kernels.small_all_reduce(peer_arrived(True), areas, 0, False, 0, zero, buf, 2, 99,
                                      5, 4, True)
    expect("the all-reduce", (status, buf.tolist()), (0, [1.5, 0.0, 10.0]))
    areas[0, :3] = buf  # this rank's input, as if published
    status = kernels.small_all_reduce(peer_arrived(True), areas, 0, False, kernels.MULTIPLY,
                                      np.float32(0.5), buf, 2, 99, 5, 4, True)
    expect("the mean", (status, buf.tolist()), (0, [1.0, -1.0, 8.5]))
    areas = np.zeros((6, 8), np.uint8)
    areas[0, :2] = [5, 6]  # a broadcast's data sits in the half's first area, whoever the root
    data = np.array([1, 2], np.uint8)
    status = kernels.small_broadcast(peer_arrived(True), areas, 0, 1, data, 2, 99, 5, 4, False)
    expect("the broadcast from rank 1", (status, data.tolist()), (0, [5, 6]))
    data = np.array([1, 2], np.uint8)
    status = kernels.small_broadcast(peer_arrived(True), areas, 0, 0, data, 2, 99, 5, 4, False)
    expect("the broadcast from rank 0", (status, areas[0, :2].tolist()), (0, [1, 2]))
    areas[1, :2] = [7, 9]
    dst = np.zeros(4, np.uint8)
    status = kernels.small_all_gather(peer_arrived(True), areas, 0,
                                      (np.array([3, 4], np.uint8), dst), 2, 99, 5, 4, False)
    expect("the all-gather", (status, dst.tolist()), (0, [3, 4, 7, 9]))


def may_compile_all_reduce(dtype: np.dtype, op: ReduceOp) -> bool:
    """Whether an all-reduce of ``dtype`` and ``op`` has a compiled form (not yet built)."""
    return dtype.type in COMPILED_DTYPES and dtype.isnative and op in COMPILED_OPS


def allowed() -> bool:
    """Whether compiling may be tried at all: Numba installed and not switched off."""
    return (os.environ.get(numba_backend.ENV_SWITCH, "1").strip() != "0"
            and importlib.util.find_spec("numba") is not None)


def _settle(c: Any, kernels: Any, status: int, gen: int, fp: Fingerprint,
            resume: Callable[[], int]) -> None:
    """After a compiled generation: wake a sleeping peer, wait for late ones and finish
    (``resume``), name a mismatch."""
    if status & kernels.WAKE and futex.AVAILABLE:
        futex.wake(c.generation.base_address + 8 * c.generation.gen_word)
    if status & kernels.WAIT:
        c.generation.wait(gen, fp.op, fp.seq)
        status = resume()
    if status >= kernels.MISMATCH:
        c.mismatch(gen, fp, status // kernels.MISMATCH - 1)


def _form(c: Any, stamp: Any, kernels: Any,
          bound: Callable[..., int]) -> Callable[[Any, Fingerprint], None]:
    """A plan's compiled form: each call begins as the Python form does (``stamp``), then
    ``bound(data, gen, sig, seq, polls, resume)`` runs the kernel (everything that stays the
    same from call to call bound to it once) on the call's ``data``."""
    g, watch = c.generation, c.t.watch

    def run(data: Any, fp: Fingerprint) -> None:
        gen, sig = stamp.begin(fp)
        # a compiled poll (with pause) takes about as long as a Python one: the same budget
        status = bound(data, gen, sig, fp.seq, watch.spin_polls, False)
        g.gen = gen
        if status:
            _settle(c, kernels, status, gen, fp, partial(bound, data, gen, sig, fp.seq, 0, True))
    return run


def all_reduce(c: Any, stamp: Any, dtype: np.dtype, n: int,
               op: ReduceOp) -> Optional[Callable[[np.ndarray, Fingerprint], None]]:
    """The compiled one-generation all-reduce of ``n`` elements, or None without the kernels."""
    kernels = _kernels()
    if kernels is None:
        return None
    mean, factor = 0, dtype.type(0)
    if op is ReduceOp.AVERAGE:  # averager's choice: the same bits as NumPy's division
        ufunc, factor = averager(dtype, c.world_size)
        mean = kernels.MULTIPLY if ufunc is np.multiply else kernels.DIVIDE
    return _form(c, stamp, kernels, partial(
        kernels.small_all_reduce, c.control_words(), c.workspace_rows(dtype), c.rank,
        op is ReduceOp.PRODUCT, mean, factor))


def broadcast(c: Any, stamp: Any, nbytes: int,
              root: int) -> Optional[Callable[[np.ndarray, Fingerprint], None]]:
    """The compiled one-generation broadcast of ``nbytes`` (a uint8 vector) from ``root``."""
    kernels = _kernels()
    if kernels is None:
        return None
    return _form(c, stamp, kernels, partial(
        kernels.small_broadcast, c.control_words(), c.workspace_rows(np.dtype(np.uint8)),
        c.rank, root))


def all_gather(c: Any, stamp: Any, dtype: np.dtype,
               n: int) -> Optional[Callable[[np.ndarray, np.ndarray, Fingerprint], None]]:
    """The compiled one-generation all-gather of ``n`` elements of ``dtype`` per rank."""
    kernels = _kernels()
    if kernels is None:
        return None
    both = _form(c, stamp, kernels, partial(
        kernels.small_all_gather, c.control_words(), c.workspace_rows(np.dtype(np.uint8)),
        c.rank))

    def run(src: np.ndarray, dst: np.ndarray, fp: Fingerprint) -> None:
        both((src.view(np.uint8), dst.view(np.uint8)), fp)
    return run
