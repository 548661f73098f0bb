"""The compiled form of a plan (``plans``): small all-reduce, broadcast and all-gather.

On a 4-byte vector the Python form of a plan costs several times its barrier: writing the
signature, arriving, polling, checking the peers, reducing or copying are each a NumPy scalar
or ufunc call. ``kernels`` takes the same steps on the same words and
areas in one compiled call (reached through ``entry_kernels``: the vector, the address of the
plan's words, the sequence number and a poll budget), so a rank on the compiled path and a rank
on the Python one meet in the same generation and end with the same bits. An all-reduce sums or multiplies in rank
order in the vector's dtype, and a mean divides by ``p`` in that dtype (multiplies by ``1/p`` for
a power-of-two ``p``, which rounds the same exact quotient, as ``reduce_ops.averager`` chooses)
in the loop that adds the last rank's vector. Broadcasts and all-gathers copy bytes, so every
dtype is compiled. A compiled broadcast's root returns once its bytes are in place, without
waiting for the readers (``generation`` says why that is safe and how its next call checks
them).

Everything rare stays in Python (``Prepared.settle``): writing the full header when the
kernel finds another collective's in place, waking a
peer asleep in the kernel, waiting beyond a short poll (with the timeout and the liveness
checks), naming a mismatch. All-reduces compiled: SUM, PRODUCT and AVERAGE of native float32,
float64, int32 and int64; MIN and MAX (NumPy's NaN rules) and float16 stay in Python. The
barrier has a compiled form too (``barrier``), for the public call's short path
(``short_calls``).

A plan changes over after ``HOT_CALLS`` calls, so a job that makes few never
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

from ....backends import numba_backend
from ...reduce_ops import ReduceOp, averager
from ..base import Fingerprint
from . import futex, kernel_sources
from .layout import EARLY

ENV_CHOICE = "NEURAL_ARCH_SHM_SMALL"
CHOICES = ("auto", "python", "compiled")
HOT_CALLS = 32
COMPILED_DTYPES = (np.float32, np.float64, np.int32, np.int64)
COMPILED_OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.AVERAGE)

_built: Dict[str, Any] = {}  # the kernel module, or why there is none


def choice(env: str = ENV_CHOICE) -> str:
    """``auto``, ``python`` or ``compiled``, as the environment variable ``env`` says (this
    module's, or another compiled form's: ``pair_rounds``)."""
    value = os.environ.get(env, "auto").strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{env}={value!r}; use one of {', '.join(CHOICES)}")
    return value


def why_not_compiled() -> str:
    """Why prepared collectives stay in Python ('' when they are compiled or not tried yet)."""
    return _built.get("why", "")


def _kernels() -> Optional[tuple]:
    """(``kernels``, ``entry_kernels``), built once, or None (``why_not_compiled()`` says why)."""
    if "module" not in _built:
        if not numba_backend.is_available():
            _built.update(module=None, why=numba_backend.unavailable_reason())
            return None
        try:
            from . import entry_kernels, kernels
            kernel_sources.refresh_cache(entry_kernels)
            _check(kernels, entry_kernels)
            _built.update(module=kernels, entry=entry_kernels, why="")
        except Exception as exc:  # an LLVM or Numba that cannot build it
            _built.update(module=None, why=f"the compiled small collectives failed: {exc!r}")
            warnings.warn(f"{_built['why']}; small shared-memory collectives stay in Python",
                          RuntimeWarning)
    return None if _built["module"] is None else (_built["module"], _built["entry"])


def _check(kernels: Any, entry: Any) -> None:
    """Compile (or load from Numba's cache) the entry kernels and run them as rank 0 of two on
    private memory: rank 0 last arrived at generation 1; the peer, rank 1, has published its
    input and signature 99 at generation 2 (or not yet)."""
    words, headers = np.zeros(32, np.int64), np.array([99, 99], np.int64)

    def plan(areas: np.ndarray, factor: Any = None, **fields: int) -> int:
        """Reset the control words; return the address of plan words for ``areas``."""
        words[:] = 0
        words[0], words[16], words[17], words[18] = 1, 2, 99, 5  # rank 1: GEN, SIG0, SEQ0
        kept.append(np.zeros(entry.PLAN_WORDS, np.int64))
        values = dict(words=words.ctypes.data, nwords=32, areas=areas.ctypes.data, rows=6,
                      cols=areas.shape[1], rank=0, size=2, sig=99, headers=headers.ctypes.data,
                      factor=0 if factor is None else factor.ctypes.data, **fields)
        for name, value in values.items():
            kept[-1][getattr(entry, name.upper())] = value
        return kept[-1].ctypes.data

    def expect(what: str, got: Any, want: Any) -> None:
        if got != want:
            raise RuntimeError(f"{what} gave {got!r}, not {want!r}")

    kept: list = []
    areas = np.zeros((6, 8), np.float32)  # rows (half, rank); the result rows stay unused
    areas[1, :3] = [0.5, -2.0, 7.0]
    buf, half = np.array([1.0, 2.0, 3.0], np.float32), np.array([0.5], np.float32)
    address = plan(areas, half)
    words[16] = 1
    status = entry.planned_all_reduce(buf, address, 5, 4)
    expect("the all-reduce before the peer arrived", (status, words[0]), (kernels.WAIT, 2))
    words[16] = 2
    status = entry.planned_all_reduce(buf, address, 5, entry.RESUME)
    expect("the all-reduce", (status, buf.tolist()), (0, [1.5, 0.0, 10.0]))
    areas[0, :3] = buf
    status = entry.planned_all_reduce(buf, plan(areas, half, mean=kernels.MULTIPLY), 5, 4)
    expect("the mean", (status, buf.tolist()), (0, [1.0, -1.0, 8.5]))
    headers[0] = 7
    expect("a stale header", entry.planned_all_reduce(buf, plan(areas, half), 5, 4),
           entry.HEADER)
    headers[0] = 99
    areas = np.zeros((6, 512), np.uint8)  # 300 bytes: past the inline copy, one memcpy
    sent = (np.arange(300) % 251).astype(np.uint8)
    areas[0, :300] = sent  # a broadcast's data sits in the half's first area, whoever the root
    data = np.zeros(300, np.uint8)
    status = entry.planned_broadcast(data, plan(areas, root=1), 5, 4)
    expect("the broadcast from rank 1", (status, bool((data == sent).all())), (0, True))
    data = sent[::-1].copy()
    status = entry.planned_broadcast(data, plan(areas, root=0), 5, 4)
    expect("the broadcast from rank 0", (status, bool((areas[0, :300] == data).all()),
                                         words[EARLY]), (0, True, 2))  # it left gen. 2 early
    words[16] = 1  # its reader has not reached it: the next call must wait first
    expect("a call after leaving early", entry.planned_barrier(kept[-1].ctypes.data, 6, 4),
           entry.SETTLE)
    areas[1, :2] = [7, 9]
    dst = np.zeros(4, np.uint8)
    status = entry.planned_all_gather(np.array([3, 4], np.uint8), dst, plan(areas), 5, 4)
    expect("the all-gather", (status, dst.tolist()), (0, [3, 4, 7, 9]))
    address = plan(areas)
    words[17] = 98  # the peer published another signature
    expect("the barrier", entry.planned_barrier(address, 5, 4), 2 * kernels.MISMATCH)


def may_compile_all_reduce(dtype: np.dtype, op: ReduceOp) -> bool:
    """Whether an all-reduce of ``dtype`` and ``op`` has a compiled form (not yet built)."""
    return dtype.type in COMPILED_DTYPES and dtype.isnative and op in COMPILED_OPS


def allowed() -> bool:
    """Whether compiling may be tried at all: Numba installed and not switched off."""
    return (os.environ.get(numba_backend.ENV_SWITCH, "1").strip() != "0"
            and importlib.util.find_spec("numba") is not None)


class Prepared:
    """One compiled prepared collective: its entry kernel (``entry_kernels``) and its plan
    words, with the arrays whose addresses they hold kept alive here (the segment stays
    mapped while a view of it lives). ``words(sig)`` is a copy of the plan words for a caller
    that keeps a signature of its own (the public short path), ``settle`` finishes a call
    whose kernel returned a status."""

    def __init__(self, c: Any, collective: str, dtype: np.dtype, nbytes: int,
                 **fields: int) -> None:
        entry = _kernels()[1]
        self.c, self.nbytes = c, nbytes
        # ``entry_kernels.planned_<collective>``, and the form releasing the GIL (if any)
        self.kernel = getattr(entry, f"planned_{collective}")
        self.releasing = getattr(entry, f"planned_{collective}_nogil", self.kernel)
        words, areas = c.control_words(), c.workspace_rows(dtype)
        self.keep = (words, areas, c.header_sigs, fields.pop("factor", None))
        plan = np.zeros(entry.PLAN_WORDS, np.int64)
        plan[[entry.WORDS, entry.NWORDS, entry.AREAS, entry.ROWS, entry.COLS]] = (
            words.ctypes.data, words.size, areas.ctypes.data, *areas.shape)
        plan[[entry.RANK, entry.SIZE, entry.HEADERS]] = (c.rank, c.world_size,
                                                         c.header_sigs.ctypes.data)
        if self.keep[3] is not None:
            plan[entry.FACTOR] = self.keep[3].ctypes.data
        for name, value in fields.items():
            plan[getattr(entry, name.upper())] = value
        self.plan, self.sig_word, self.resume = plan, entry.SIG, entry.RESUME

    def words(self, sig: int) -> np.ndarray:
        plan = self.plan.copy()
        plan[self.sig_word] = sig
        return plan

    def settle(self, status: int, args: tuple, address: int, fp: Fingerprint, sig: int) -> None:
        """After the kernel returned ``status`` (not 0) for ``args``: settle an early left
        generation (SETTLE) or write the header (HEADER) and run again, wake a sleeping peer,
        wait for late ones and finish, name a mismatch."""
        c, kernels, kernel = self.c, _built["module"], self.releasing
        g, entry = c.generation, _built["entry"]
        while status < 0:  # nothing published yet
            if status == entry.SETTLE:
                c.settle_early(fp)
            else:  # entry_kernels.HEADER
                c.publish_header(g.gen + 1, fp, self.nbytes, sig)
            status = kernel(*args, address, fp.seq, c.t.watch.spin_polls)
            if not status:
                return
        gen = g.gen  # the kernel arrived there
        if status & kernels.WAKE and futex.AVAILABLE:
            futex.wake(g.base_address + 8 * g.gen_word)
        if status & kernels.WAIT:
            g.wait(gen, fp.op, fp.seq)
            status = kernel(*args, address, fp.seq, self.resume)
        if status >= kernels.MISMATCH:
            c.mismatch(gen, fp, status // kernels.MISMATCH - 1)


def _form(prepared: Prepared, stamp: Any) -> Callable[..., None]:
    """A plan's compiled form, as the transport's collectives call it: ``run(*arrays, fp)``.
    The signature follows ``fp`` (looked up again only when more than its sequence number
    changes, as ``stamp`` does for the Python form)."""
    c, kernel, watch = prepared.c, prepared.releasing, prepared.c.t.watch
    plan = prepared.plan
    address, sig_word = plan.ctypes.data, prepared.sig_word

    def run(*args: Any) -> None:
        *arrays, fp = args
        if c.closed:
            c.check_open(fp)  # raises
        sig = stamp.signature(fp)
        if plan[sig_word] != sig:
            plan[sig_word] = sig
        # a compiled poll (with pause) takes about as long as a Python one: the same budget
        status = kernel(*arrays, address, fp.seq, watch.spin_polls)
        if status:
            prepared.settle(status, tuple(arrays), address, fp, sig)
    run.prepared = prepared
    return run


def all_reduce(c: Any, stamp: Any, dtype: np.dtype, n: int,
               op: ReduceOp) -> Optional[Callable[[np.ndarray, Fingerprint], None]]:
    """The compiled one-generation all-reduce of ``n`` elements, or None without the kernels."""
    built = _kernels()
    if built is None:
        return None
    kernels = built[0]
    mean, factor = 0, dtype.type(0)
    if op is ReduceOp.AVERAGE:  # averager's choice: the same bits as NumPy's division
        ufunc, factor = averager(dtype, c.world_size)
        mean = kernels.MULTIPLY if ufunc is np.multiply else kernels.DIVIDE
    return _form(Prepared(c, "all_reduce", dtype, dtype.itemsize * n,
                          product=int(op is ReduceOp.PRODUCT), mean=mean,
                          factor=np.array([factor], dtype)), stamp)


def broadcast(c: Any, stamp: Any, nbytes: int,
              root: int) -> Optional[Callable[[np.ndarray, Fingerprint], None]]:
    """The compiled one-generation broadcast of ``nbytes`` from ``root`` (of any dtype: the
    kernel copies its bytes)."""
    built = _kernels()
    if built is None:
        return None
    return _form(Prepared(c, "broadcast", np.dtype(np.uint8), nbytes, root=root),
                 stamp)


def all_gather(c: Any, stamp: Any, dtype: np.dtype,
               n: int) -> Optional[Callable[[np.ndarray, np.ndarray, Fingerprint], None]]:
    """The compiled one-generation all-gather of ``n`` elements of ``dtype`` per rank."""
    built = _kernels()
    if built is None:
        return None
    both = _form(Prepared(c, "all_gather", np.dtype(np.uint8),
                          dtype.itemsize * n), stamp)

    def run(src: np.ndarray, dst: np.ndarray, fp: Fingerprint) -> None:
        both(src.view(np.uint8), dst.view(np.uint8), fp)  # Numba has no float16 arrays
    run.prepared = both.prepared
    return run


def barrier(c: Any) -> Optional[Prepared]:
    """The compiled barrier (one generation, no data), or None without the kernels."""
    built = _kernels()
    return None if built is None else Prepared(c, "barrier", np.dtype(np.uint8), 0)
