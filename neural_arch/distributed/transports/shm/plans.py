"""One plan per small collective shape: prepared once, then run in one generation a call.

On a vector of a few bytes, looking up views, control words and signatures is most of a
direct collective's time. A plan is built the first time a shape is seen, keyed
``("all_reduce", dtype, n, op)``, ``("broadcast", nbytes, root)`` or ``("all_gather", dtype,
n)``, and kept in ``ShmCollectives.plans``: it takes the steps of the general algorithm in
``direct`` (same workspace areas, same generation, same checks), with everything that stays the
same from call to call looked up when it was built. A plan has two forms: the Python one below,
and a compiled one (``compiled``) that takes the same steps on the same words in one call, so
ranks on different forms meet in the same generation and end with the same bits (one step
differs: the compiled broadcast's root returns without waiting for the readers, which only it
needs to know, ``generation``). A plan starts in Python and changes to its compiled form
once it runs often (``compiled.choice``).
"""
from __future__ import annotations

from functools import partial
from typing import Any, Callable, Dict, Optional

import numpy as np

from ...reduce_ops import ReduceOp, averager, ufunc_for
from ...reductions.kernels import sum_halves
from ..base import Fingerprint
from . import compiled, direct

MAX_PLANS = 1024  # shapes kept per transport; past this the cache starts afresh
# Broadcast plans up to this many bytes per world size (other world sizes: direct.SMALL_BYTES),
# and below the size from which the ranks read the root's buffer instead where they can
# (``single_copy.BROADCAST_MIN_BYTES``); larger broadcasts take ``direct`` or ``single_copy``.
# At p = 2 the compiled plan copies with memcpy (``byte_copies``) and its root does not wait
# for the reader. In turns with MPI_Bcast in the same processes on two busy cores (``python
# benchmarks/pair_shm_mpi.py --collectives broadcast --sizes 64K,256K,1023K --turns 30 --calls
# 100``, runs alternated), time over MPI_Bcast's: the plan 1.71x, 1.80x, 1.96x (medians of nine
# runs); copying in 16 KiB chunks that the reader takes while the root writes the next,
# 1.69x, 1.79x, 2.02x: no gain, so a plan copies in one piece. The round-based broadcast
# (plans only up to 128 KiB), four runs: 256 KiB 2.60-2.66x against the plan's 1.74-1.94x,
# 1023 KiB 2.24-2.63x against 2.01-2.12x. A root running one generation further ahead of its
# reader (three areas in turn, settling g - 1 before writing g + 1, ``generation``) took
# 0.96-1.01x the time of the same three areas settling g, at 32-256 KiB (medians of 7-9 runs,
# in turns in one job): no gain, so two halves. Not where a rank's writer is fixed to streaming
# stores (``writer``, ``NEURAL_ARCH_SHM_STORES=stream``): plans then stop at ``small_bytes``,
# and larger broadcasts go through the writer.
BROADCAST_PLAN_BYTES = {2: 1 << 20}


def broadcast_plan_bytes(world_size: int, small_bytes: int, workspace_bytes: int,
                         peer_reads_from: Optional[int] = None, streamed: bool = False) -> int:
    """The largest broadcast (bytes) a plan takes on ``world_size`` ranks; ``peer_reads_from``:
    the size from which this job's broadcasts read the root's buffer (None: never);
    ``streamed``: whether a rank's writer streams every large copy."""
    planned = small_bytes if streamed else max(BROADCAST_PLAN_BYTES.get(world_size, 0),
                                               small_bytes)
    most = min(planned, workspace_bytes)
    return most if peer_reads_from is None else min(most, max(peer_reads_from - 1, small_bytes))


class Stamp:
    """What every call of a plan starts with: the signature of its fingerprint (looked up again
    only when the fingerprint but its sequence number changes) and the header a peer decodes to
    name a mismatch (rewritten only when it changed). ``begin`` returns (generation, signature)."""

    __slots__ = ("c", "nbytes", "key", "sig")

    def __init__(self, c: Any, nbytes: int) -> None:
        self.c, self.nbytes, self.key, self.sig = c, nbytes, None, 0

    def signature(self, fp: Fingerprint) -> int:
        """The signature of ``fp`` (the compiled form checks the header itself)."""
        key = (fp.op, fp.dtype, fp.count, fp.group)
        if key != self.key:
            self.key, self.sig = key, self.c.signature(fp, self.nbytes)
        return self.sig

    def begin(self, fp: Fingerprint) -> tuple[int, int]:
        sig = self.signature(fp)
        return self.c.next_generation(fp, self.nbytes, sig), sig

    def meet(self, gen: int, fp: Fingerprint) -> None:
        """Publish, arrive at ``gen``, wait for every peer, and check that all called ``fp``."""
        c, sig = self.c, self.sig
        g = c.generation
        g.publish(gen, sig, fp.seq)
        peer = g.meet(gen, sig, fp.seq, fp.op)
        if peer >= 0:
            c.mismatch(gen, fp, peer)


def python_all_reduce(c: Any, stamp: Stamp, dtype: np.dtype, n: int,
                      op: ReduceOp) -> Callable[[np.ndarray, Fingerprint], None]:
    """Everyone publishes its vector, then reduces all of them in rank order (so every rank
    ends with the same bits)."""
    inputs, _ = c.views(dtype)
    halves = tuple(tuple(a[:n] for a in inputs[h]) for h in (0, 1))
    ufunc, average = ufunc_for(op), op is ReduceOp.AVERAGE
    scale, factor = averager(dtype, c.world_size)
    rank = c.rank
    if direct.sums_halves(dtype, op):  # in float32, rounded once, as the large rounds do
        divisor = c.world_size if average else 0

        def reduce(buf: np.ndarray, slots: tuple) -> None:
            sum_halves(buf, slots, divisor)
    else:
        def reduce(buf: np.ndarray, slots: tuple) -> None:
            ufunc(slots[0], slots[1], out=buf)
            for other in slots[2:]:
                ufunc(buf, other, out=buf)
            if average:
                scale(buf, factor, out=buf)

    def run(buf: np.ndarray, fp: Fingerprint) -> None:
        gen = stamp.begin(fp)[0]
        slots = halves[gen & 1]
        slots[rank][...] = buf
        stamp.meet(gen, fp)
        reduce(buf, slots)
    return run


def python_broadcast(c: Any, stamp: Stamp, nbytes: int,
                     root: int) -> Callable[[np.ndarray, Fingerprint], None]:
    """The root publishes the bytes in the half's first input area (where the general
    broadcast puts them too); the others copy them out."""
    areas = tuple(c.views(np.dtype(np.uint8))[0][h][0][:nbytes] for h in (0, 1))
    is_root = c.rank == root

    def run(data: np.ndarray, fp: Fingerprint) -> None:
        gen = stamp.begin(fp)[0]
        if is_root:
            areas[gen & 1][...] = data
        stamp.meet(gen, fp)
        if not is_root:
            data[...] = areas[gen & 1]
    return run


def python_all_gather(c: Any, stamp: Stamp, dtype: np.dtype,
                      n: int) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """Everyone publishes its block in its own input area of the half (as the general
    all-gather does), then copies all of them out in rank order."""
    inputs, _ = c.views(dtype)
    areas = tuple(tuple(a[:n] for a in inputs[h]) for h in (0, 1))
    rank = c.rank

    def run(src: np.ndarray, dst: np.ndarray, fp: Fingerprint) -> None:
        gen = stamp.begin(fp)[0]
        blocks = areas[gen & 1]
        blocks[rank][...] = src
        stamp.meet(gen, fp)
        np.concatenate(blocks, out=dst)
    return run


_PYTHON = {"all_reduce": python_all_reduce, "broadcast": python_broadcast,
           "all_gather": python_all_gather}
_COMPILED = {"all_reduce": compiled.all_reduce, "broadcast": compiled.broadcast,
             "all_gather": compiled.all_gather}


def build(c: Any, key: tuple) -> Callable[..., None]:
    """The plan for ``key``, stored in ``c.plans``: its Python form, or its compiled form now
    or after ``compiled.HOT_CALLS`` calls, as ``compiled.choice()`` says."""
    plans: Dict[tuple, Callable[..., None]] = c.plans
    if len(plans) >= MAX_PLANS:
        plans.clear()
    kind, args = key[0], key[1:]
    nbytes = args[0] if kind == "broadcast" else args[0].itemsize * args[1]
    stamp = Stamp(c, nbytes)  # both forms begin the same way, with the same cached signature
    python_run = _PYTHON[kind](c, stamp, *args)
    make_compiled = partial(_COMPILED[kind], c, stamp, *args)
    eligible = kind != "all_reduce" or compiled.may_compile_all_reduce(key[1], key[3])
    mode = compiled.choice() if eligible and compiled.allowed() else "python"
    if mode == "python":
        run = python_run
    elif mode == "compiled":
        run = make_compiled() or python_run
    else:
        calls = [0]

        def run(*call_args: Any) -> None:
            python_run(*call_args)
            calls[0] += 1
            if calls[0] >= compiled.HOT_CALLS and plans.get(key) is run:
                plans[key] = make_compiled() or python_run
    plans[key] = run
    return run
