"""The round-based direct collectives through the shared-memory workspace.

Each collective is a few generations of the barrier (``generation``): before arriving a rank
writes only its own input area of the current half of the workspace (a broadcast root all of
them); after everyone arrived it reads any input area of that half and writes only its own
slice of the result area. ``ShmCollectives`` validates the arguments and sends vectors of up
to SMALL_BYTES (broadcasts at p = 2: up to ``plans.BROADCAST_PLAN_BYTES``) to a plan
(``plans``) instead; the functions here take it as ``c`` and hold no state of their own.

All-reduce: every element is reduced by exactly one rank, over ranks 0..p-1 in that order, and
copied by everyone from the shared result: results are bit-identical on all ranks. Two ranks
instead both reduce everything, with the operands in the same order. A float16 sum is taken
in float32 over all p operands and rounded once (``reductions.kernels``). ``reference.py``
beside this file is the same all-reduce without rounds or slices, to read first. Where the
ranks can read each other's memory, a large all-reduce may instead run by peer reads, one copy
and the same bits (``single_copy``); ``tuning`` decides which. The two-rank rounds also have a
compiled form, the same steps in one call (``pair_rounds``).
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ...reduce_ops import ReduceOp, averager, divide_by_count, ufunc_for
from ...reductions.kernels import pair_mean_for, sum_halves
from ..base import Fingerprint
from . import single_copy, tuning
from .cross_memory import ENV_SWITCH as PEER_READ_SWITCH
from .tuning import Choice

# Measured at p = 2 and 4 on two cores: up to ~128 KiB one barrier with every rank reducing the
# whole vector beats two barriers with a 1/p share each; 1 MiB rounds keep large vectors in
# cache, and let a broadcast's root fill one half of the workspace while the others read the
# other (4 and 16 MiB broadcasts at p = 2 took 1.3-1.5x as long in one round per workspace).
# A larger all-reduce's algorithm and rounds are the tuning table's (``tuning``).
SMALL_BYTES = 128 << 10     # at or below: every rank reduces the whole vector, one barrier
ROUND_BYTES = tuning.DEFAULT_ROUND_BYTES  # broadcast data per round; all-reduce's default
ALIGN_BYTES = 64            # slice boundaries fall on cache lines


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def slice_of(m: int, p: int, rank: int, itemsize: int) -> tuple[int, int]:
    """This rank's part of ``m`` elements: cache-line aligned, the last parts may be empty."""
    align = max(1, ALIGN_BYTES // itemsize)
    per = _ceil_div(_ceil_div(m, p), align) * align
    return min(rank * per, m), min((rank + 1) * per, m)


# ----- all-reduce ---------------------------------------------------------------------------
def sums_halves(dtype: np.dtype, op: ReduceOp) -> bool:
    """Whether ``op`` on ``dtype`` is a float16 sum, which ``sum_halves`` takes in float32 and
    rounds once, the mean included (``reductions.kernels``)."""
    return dtype == np.float16 and ufunc_for(op) is np.add


def pair_round(dtype: np.dtype, op: ReduceOp, rank: int) -> Callable[[Any, Any], None]:
    """``reduce(part, other)``: ``part = x0 op x1`` in place on a rank of two, rank 0's operand
    first, the mean included in the same pass."""
    first = rank == 0
    if sums_halves(dtype, op):
        divisor = 2 if op is ReduceOp.AVERAGE else 0
        return lambda part, other: sum_halves(part, (part, other) if first else (other, part),
                                              divisor)
    if op is ReduceOp.AVERAGE:
        factor = averager(dtype, 2)[1]  # 1/2: the product rounds as the quotient does
        mean = pair_mean_for(dtype)  # the compiled loop itself: rounds are checked vectors
        return lambda part, other: mean(part, other, factor, first)
    ufunc = ufunc_for(op)
    if first:
        return lambda part, other: ufunc(part, other, out=part)
    return lambda part, other: ufunc(other, part, out=part)


def all_reduce(c: Any, buf: np.ndarray, op: ReduceOp, fp: Fingerprint,
               choice: Optional[Choice] = None) -> None:
    """A vector larger than the small plans take, in rounds: ``choice``'s algorithm and round
    size, by default the tuning table's for this world size and size (``tuning``); peer reads
    (``single_copy``) where the ranks agreed at set-up that they can."""
    workspace = c.layout.workspace_bytes
    reads = c.t.peer_reads
    peer_reads = tuning.peer_level(reads.usable, reads.writable)
    if choice is None:
        choice, suffix = tuning.decide(c.world_size, buf.nbytes, workspace, peer_reads,
                                       reads.pays)
        if suffix:  # ranks that chose differently meet different signatures: a mismatch
            fp = fp._replace(op=fp.op + suffix)
    else:
        if choice.algorithm == "whole" and c.world_size != 2:
            raise ValueError(f"the 'whole' all-reduce runs on two ranks, not {c.world_size}")
        if choice.algorithm == "peer_read" and not peer_reads:
            raise ValueError("the 'peer_read' all-reduce needs every rank to read its peers' "
                             "memory, which this job's ranks cannot (or "
                             f"{PEER_READ_SWITCH} turned off)")
        fp = tuning.tagged(fp, choice, c.world_size, workspace, buf.nbytes, peer_reads,
                           reads.pays)
    if choice.algorithm == "peer_read":
        single_copy.all_reduce(c, buf, op, fp, choice.round_bytes)
        return
    step = max(1, min(choice.round_bytes, workspace) // buf.itemsize)
    if choice.algorithm == "whole":
        _whole_rounds(c, buf, op, fp, step)
    else:
        split_rounds(c, buf, op, fp, step)


def pair_all_reduce(c: Any, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """Two ranks: the tuning table's algorithm (``all_reduce``)."""
    all_reduce(c, buf, op, fp)


def large_all_reduce(c: Any, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """Three or more ranks: the tuning table's rounds (``all_reduce``)."""
    all_reduce(c, buf, op, fp)


def _whole_rounds(c: Any, buf: np.ndarray, op: ReduceOp, fp: Fingerprint, step: int) -> None:
    """Two ranks: ``python_whole_rounds``, or the same steps in one compiled call
    (``pair_rounds``) once a rank has made enough of these calls to pay for compiling."""
    if c.pair_rounds.takes(buf, op):
        c.pair_rounds.run(buf, op, fp, step)
    else:
        python_whole_rounds(c, buf, op, fp, step)


def python_whole_rounds(c: Any, buf: np.ndarray, op: ReduceOp, fp: Fingerprint,
                        step: int) -> None:
    """Two ranks: both reduce every round whole, as ``x0 op x1`` with the same operands in the
    same order (so both get the same bits). Each rank copies its round into the workspace and
    nothing back out, one barrier a round. A mean is taken in the pass that adds (a second pass
    over each round cost AVERAGE 17-19% over SUM at 256 KiB-4 MiB)."""
    inputs, _ = c.views(buf.dtype)
    rank = c.rank
    reduce_round = pair_round(buf.dtype, op, rank)
    gen, sig = c.begin(fp, buf.nbytes)
    for lo in range(0, buf.size, step):
        part = buf[lo:lo + step]
        areas = inputs[gen & 1]
        c.writer.write(areas[rank][:part.size], part)
        c.sync(gen, fp, sig if lo == 0 else 0)
        reduce_round(part, areas[1 - rank][:part.size])
        gen += 1


def split_rounds(c: Any, buf: np.ndarray, op: ReduceOp, fp: Fingerprint, step: int) -> None:
    """In each round rank r reduces slice r of everyone's inputs into the result area; after
    the next generation's barrier everyone copies the other slices out."""
    p, rank, itemsize = c.world_size, c.rank, buf.itemsize
    inputs, results = c.views(buf.dtype)
    ufunc, halves = ufunc_for(op), sums_halves(buf.dtype, op)
    divisor = p if op is ReduceOp.AVERAGE else 0
    scale, factor = averager(buf.dtype, p)
    if divisor and not halves:
        # the result area holds the sum; every rank divides as it copies its slices out, so
        # the mean costs no pass of its own and every rank rounds the same sum the same way
        def take(dst: np.ndarray, src: np.ndarray) -> None:
            scale(src, factor, out=dst)
    else:
        take = np.copyto
    rounds = _ceil_div(buf.size, step)
    gen, sig = c.begin(fp, buf.nbytes)
    prev = None  # (start, stop, own slice) of the previous round, copied out after its barrier
    for k in range(rounds + 1):
        half = gen & 1
        if k < rounds:
            lo, hi = k * step, min((k + 1) * step, buf.size)
            m = hi - lo
            s_lo, s_hi = slice_of(m, p, rank, itemsize)
            mine = inputs[half][rank]
            # peers reduce the other slices; this rank's own slice needs no copy
            c.writer.write(mine[:s_lo], buf[lo:lo + s_lo])
            c.writer.write(mine[s_hi:m], buf[lo + s_hi:hi])
        c.sync(gen, fp, sig if k == 0 else 0)
        if prev is not None:
            p_lo, p_hi, p_s_lo, p_s_hi = prev
            done = results[half ^ 1]
            take(buf[p_lo:p_lo + p_s_lo], done[:p_s_lo])
            take(buf[p_lo + p_s_hi:p_hi], done[p_s_hi:p_hi - p_lo])
        if k < rounds:
            if s_hi > s_lo:
                out = results[half][s_lo:s_hi]
                operands = [buf[lo + s_lo:lo + s_hi] if r == rank else inputs[half][r][s_lo:s_hi]
                            for r in range(p)]
                if halves:
                    sum_halves(out, operands, divisor)
                else:
                    ufunc(operands[0], operands[1], out=out)
                    for other in operands[2:]:
                        ufunc(out, other, out=out)
                take(buf[lo + s_lo:lo + s_hi], out)
            prev = (lo, hi, s_lo, s_hi)
        gen += 1


# ----- broadcast, all-gather, reduce-scatter, barrier ----------------------------------------
def broadcast(c: Any, data: np.ndarray, root: int, fp: Fingerprint) -> None:
    """Copy ``root``'s bytes ``data`` into every rank's ``data``, in rounds through the input
    areas of a half (contiguous: the root fills up to all of them each round)."""
    step = min(c.world_size * c.layout.workspace_bytes, ROUND_BYTES)
    rounds = max(1, _ceil_div(data.size, step))
    gen, sig = c.begin(fp, data.size)
    for k in range(rounds):
        lo, hi = k * step, min((k + 1) * step, data.size)
        area = c.half_inputs(gen & 1)[:hi - lo]
        if c.rank == root:
            c.writer.write(area, data[lo:hi])
        c.sync(gen, fp, sig if k == 0 else 0)
        if c.rank != root:
            data[lo:hi] = area
        gen += 1


def all_gather(c: Any, sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
    """``recvbuf`` (world_size x len(sendbuf), rank order) receives every rank's ``sendbuf``."""
    src, dst = sendbuf.view(np.uint8), recvbuf.view(np.uint8)
    nbytes, step = src.size, c.layout.workspace_bytes
    inputs, _ = c.views(np.dtype(np.uint8))
    rounds = max(1, _ceil_div(nbytes, step))
    own = dst[c.rank * nbytes:(c.rank + 1) * nbytes]
    in_place = own.ctypes.data == src.ctypes.data  # sendbuf is this rank's block of recvbuf
    peers = c.generation.peers
    gen, sig = c.begin(fp, nbytes)
    for k in range(rounds):
        lo, hi = k * step, min((k + 1) * step, nbytes)
        areas = inputs[gen & 1]
        c.writer.write(areas[c.rank][:hi - lo], src[lo:hi])
        if not in_place:  # while the peers may still be copying theirs in
            own[lo:hi] = src[lo:hi]
        c.sync(gen, fp, sig if k == 0 else 0)
        for r in peers:
            dst[r * nbytes + lo:r * nbytes + hi] = areas[r][:hi - lo]
        gen += 1


def reduce_scatter(c: Any, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   fp: Fingerprint) -> None:
    """``recvbuf`` (length n) receives chunk ``rank`` of the reduction of ``sendbuf`` (p x n)."""
    p, rank, n = c.world_size, c.rank, recvbuf.size
    ufunc, itemsize = ufunc_for(op), sendbuf.itemsize
    halves = sums_halves(sendbuf.dtype, op)
    inputs, _ = c.views(sendbuf.dtype)
    step = c.layout.workspace_bytes // p // itemsize
    align = max(1, ALIGN_BYTES // itemsize)
    if step > align:
        step = step // align * align
    rounds = max(1, _ceil_div(n, step))
    # an in-place call (recvbuf inside sendbuf) must not overwrite this rank's own piece
    # before reading it, so then that piece goes through the workspace too
    own_in_shm = np.may_share_memory(sendbuf, recvbuf)
    gen, sig = c.begin(fp, sendbuf.nbytes)
    for k in range(rounds):
        lo, hi = k * step, min((k + 1) * step, n)
        m = hi - lo
        mine = inputs[gen & 1][rank]
        for r in range(p):
            if r != rank or own_in_shm:
                c.writer.write(mine[r * step:r * step + m], sendbuf[r * n + lo:r * n + hi])
        c.sync(gen, fp, sig if k == 0 else 0)
        operands = [sendbuf[rank * n + lo:rank * n + hi] if r == rank and not own_in_shm
                    else inputs[gen & 1][r][rank * step:rank * step + m] for r in range(p)]
        out = recvbuf[lo:hi]
        if halves:
            sum_halves(out, operands, p if op is ReduceOp.AVERAGE else 0)
        else:
            ufunc(operands[0], operands[1], out=out)
            for other in operands[2:]:
                ufunc(out, other, out=out)
            if op is ReduceOp.AVERAGE:
                divide_by_count(out, p)
        gen += 1


def barrier(c: Any, fp: Fingerprint) -> None:
    """Return once every rank has called ``barrier`` with the same fingerprint."""
    gen, sig = c.begin(fp, 0)
    c.sync(gen, fp, sig)
