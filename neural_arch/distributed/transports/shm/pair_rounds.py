"""The two-rank ``whole`` all-reduce (``direct``) with all its rounds in one compiled call.

In Python every round of ``direct._whole_rounds`` pays for the generation's bookkeeping,
the slicing, the arrival and the poll loop and the reduction's call: several microseconds a
round, which at 1 MiB in 256 KiB rounds was the whole difference to MPI_Allreduce.
``pair_kernels.whole_rounds`` takes the same steps on the same words and areas in one call
that releases the GIL, and hands back to Python only what is rare (``PairRounds.run``): waking
a peer asleep in the kernel, waiting for a late one with the timeout and the liveness checks
(then the loop goes on at the round it stopped), naming a mismatch. Since both forms take the
same steps, ranks on different forms meet in the same generations with the same bits (but for
a NaN made of two NaNs with different payloads, of which NumPy's loops keep either, depending
on the element's place in the vector).

The first round's copy stays in Python, through the workspace writer (``writer``): it keeps
timing the copies, and while it prefers streaming stores (cores that share no cache) the whole
call stays in Python, whose rounds it writes. Compiled: SUM, PRODUCT, MIN, MAX and AVERAGE of
native float32, float64, int32 and int64 (float16 sums stay in Python), each checked against
NumPy when built. ``NEURAL_ARCH_SHM_ROUNDS`` = ``python`` never compiles, ``compiled`` from
the first call, ``auto`` (the default) after ``compiled.HOT_CALLS`` calls, so a job that makes
few never imports Numba for it.
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, Optional

import numpy as np

from ...reduce_ops import ReduceOp, averager
from ..base import Fingerprint
from . import compiled, futex, kernel_sources

ENV_CHOICE = "NEURAL_ARCH_SHM_ROUNDS"
DTYPES = (np.float32, np.float64, np.int32, np.int64)
_built: Dict[str, Any] = {}  # "module": the kernels or None, "ops": {(dtype, op): code}, "why"


def choice() -> str:
    """``auto``, ``python`` or ``compiled``: ``NEURAL_ARCH_SHM_ROUNDS``."""
    return compiled.choice(ENV_CHOICE)


def why_not_compiled() -> str:
    """Why the rounds stay in Python ('' when they are compiled or not tried yet)."""
    return _built.get("why", "")


def _op_codes(kernels: Any) -> Dict[ReduceOp, int]:
    return {ReduceOp.SUM: kernels.SUM, ReduceOp.PRODUCT: kernels.PRODUCT,
            ReduceOp.MIN: kernels.MIN, ReduceOp.MAX: kernels.MAX,
            ReduceOp.AVERAGE: kernels.MEAN}


def kernels() -> Optional[Any]:
    """``pair_kernels``, built and checked once, or None (``why_not_compiled()`` says why)."""
    if "module" not in _built:
        if not compiled.allowed():
            _built.update(module=None, ops={}, why="Numba is not installed or switched off")
            return None
        try:
            from . import pair_kernels
            kernel_sources.refresh_cache(pair_kernels)
            _built.update(module=pair_kernels, ops=_checked_ops(pair_kernels), why="")
        except Exception as exc:  # an LLVM or Numba that cannot build it
            _built.update(module=None, ops={}, why=f"the compiled rounds failed: {exc!r}")
            warnings.warn(f"{_built['why']}; the two-rank rounds stay in Python",
                          RuntimeWarning)
    return _built["module"]


def _checked_ops(kernels: Any) -> Dict[tuple, int]:
    """{(dtype, op): code} of the reductions whose bits equal NumPy's, run as both ranks on
    private memory (the peer has arrived, with the same fingerprint) over values that tell
    NaN payloads, -0.0 and infinities apart; a pair that differs stays in Python, named."""
    words = np.zeros(32, np.int64)  # two control lines: GEN, then the slots of each parity
    words[[0, 3, 4]] = words[[16, 19, 20]] = (1, 7, 3)  # both at generation 1: sig 7, seq 3
    values = np.array([1.5, -0.0, 0.0, -0.0, np.inf, -2.0, 3.25, 7.0, 0.5, -1.0, 2.0, 9.0])
    ops, wrong = {}, []
    for dtype in DTYPES:
        x = values.astype(dtype) if np.dtype(dtype).kind == "f" else np.arange(-5, 7, dtype=dtype)
        y = np.roll(x, 1)
        if np.dtype(dtype).kind == "f":
            bits = x.view(np.int32 if dtype == np.float32 else np.int64)
            x[1:3], y[2] = np.nan, np.nan
            bits[2] ^= 1  # another NaN payload
        for op, code in _op_codes(kernels).items():
            if op is ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
                continue
            ufunc, factor = averager(np.dtype(dtype), 2)
            same = True
            for rank in (0, 1):
                areas = np.zeros((6, x.size), dtype)
                areas[3 + 1 - rank] = y  # the peer's round at generation 1 (half 1)
                got = x.copy()
                status = kernels.whole_rounds(got, areas, words, rank, 1, 7, 3, x.size, 0,
                                              kernels.COPY, 4, code, factor)
                a, b = (x, y) if rank == 0 else (y, x)
                with np.errstate(all="ignore"):
                    want = (np.add(a, b) * factor if op is ReduceOp.AVERAGE
                            else {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply,
                                  ReduceOp.MIN: np.minimum, ReduceOp.MAX: np.maximum}[op](a, b))
                same &= status == (0, 1) and got.tobytes() == want.astype(dtype).tobytes()
            if same:
                ops[(np.dtype(dtype), op)] = code
            else:
                wrong.append(f"{op.name} of {np.dtype(dtype).name}")
    if wrong:
        warnings.warn(f"the compiled two-rank rounds differ from NumPy for {', '.join(wrong)}; "
                      "those stay in Python", RuntimeWarning)
    return ops


class PairRounds:
    """One rank's compiled ``whole`` rounds: when to take them (``takes``) and running them
    (``run``), with the workspace rows per dtype kept between calls."""

    def __init__(self, c: Any) -> None:
        self.c = c
        self.choice = choice() if compiled.allowed() else "python"
        self.calls = 0
        self.rows: Dict[np.dtype, np.ndarray] = {}
        self.words: Optional[np.ndarray] = None

    def takes(self, buf: np.ndarray, op: ReduceOp) -> bool:
        """Whether this call of the rounds runs compiled (counting calls in ``auto``); ``buf``
        is 1-D and C-contiguous (an unaligned one stays in Python: Numba would compile the
        loop again for it)."""
        if self.choice == "python":
            return False
        if self.choice == "auto" and self.calls < compiled.HOT_CALLS:
            self.calls += 1
            return False
        if self.c.writer.kind != "plain" or kernels() is None:
            return False
        return (buf.dtype, op) in _built["ops"] and buf.flags.aligned

    def hot(self) -> None:
        """Count this rank's calls as HOT_CALLS made: a benchmark times the form a long job
        runs (``auto`` only; the other choices stand)."""
        self.calls = compiled.HOT_CALLS

    def run(self, buf: np.ndarray, op: ReduceOp, fp: Fingerprint, step: int) -> None:
        """The rounds of ``direct._whole_rounds``, after ``takes`` said yes."""
        c, kernel = self.c, _built["module"]
        dtype, rank, g = buf.dtype, c.rank, c.generation
        rows = self.rows.get(dtype)
        if rows is None:
            rows = self.rows[dtype] = c.workspace_rows(dtype)
        factor = averager(dtype, 2)[1] if op is ReduceOp.AVERAGE else dtype.type(0)
        code = _built["ops"][(dtype, op)]
        words = self.words
        if words is None:
            words = self.words = c.control_words()
        gen, sig = c.begin(fp, buf.nbytes)
        first = min(step, buf.size)
        c.writer.write(rows[(gen & 1) * 3 + rank][:first], buf[:first])
        start, stage = 0, kernel.ARRIVE
        while True:
            status, start = kernel.whole_rounds(buf, rows, words, rank, gen, sig, fp.seq, step,
                                                start, stage, c.t.watch.spin_polls, code,
                                                factor)
            if not status:
                return
            if status >= kernel.MISMATCH:
                c.mismatch(gen, fp, status // kernel.MISMATCH - 1)
            if status == kernel.WAKE:
                if futex.AVAILABLE:
                    futex.wake(g.base_address + 8 * g.gen_word)
                stage = kernel.POLL
            else:  # WAIT: the peer is late; wait with the timeout and the liveness checks
                g.wait(gen + start, fp.op, fp.seq)
                stage = kernel.CHECK

    def clear(self) -> None:
        """Drop the views of the workspace (the transport is closing)."""
        self.rows.clear()
        self.words = None
