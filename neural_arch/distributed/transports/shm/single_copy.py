"""The large all-reduce and broadcast by peer reads: each byte is copied once, not twice.

The workspace algorithms (``direct``) copy a rank's vector into shared memory and the result
back out; here a rank reads its peers' buffers where they lie (``cross_memory``), as Open MPI
does with cross-memory attach. At entry each rank stores its buffer's address in its control
line (word BUFFER) and meets the others in a generation whose signature check refuses
mismatched calls before anything is read; the pids were exchanged at set-up.

All-reduce, three generations:

1. Rank r owns slice r of the vector (``direct.slice_of``: cache-line aligned, the last slices
   may be empty). In chunks of ``chunk_bytes`` it reads every peer's part of that chunk into
   private scratch and reduces the operands over ranks 0..p-1 in that order into its own
   buffer, with the kernels the workspace algorithms use: two ranks ``x0 op x1`` (the mean in
   the same pass, ``direct.pair_round``), more ranks as ``direct.split_rounds`` reduces a
   slice (a float16 sum in float32 rounded once, a mean divided after the sum). So every
   element has the workspace algorithms' bits.
2. After the second generation every owner's slice is final: each rank reads the other slices
   from their owners straight into its own buffer.
3. A third generation before returning: a peer may still be reading this rank's buffer, which
   the caller may change once the call returns.

No rank writes what a peer reads in the same phase: in phase 1 rank q writes only slice q of
its buffer and reads slice r of the others; in phase 2 it writes the other slices and reads
only the owners' own slices.

Where the ranks agreed that they can also write each other's memory, phase 2 moves into
phase 1: as soon as an owner has reduced a chunk of its slice, it writes the chunk (still in
its cache) into the same place in every peer's buffer, and the second generation ends the
call. Slice r of a peer's buffer is touched by rank r alone (read as an operand, then
overwritten with the result), and each peer reads only its own slice of this rank's buffer, so
still no rank writes what another reads; every element has the same bits as before (the
owner's result, copied).

Broadcast, two generations: the non-roots read the root's buffer; the root waits for them. At
two ranks, where the ranks agreed that they can also write each other's memory, the root writes
the first half into the reader's buffer while the reader reads the second: one copy per byte
still, but both cores copy. Every rank marks its buffer word with ``ROOT_FLAG`` when it is the
root: the public calls' fingerprints name the root, but a rank reads or writes only where
every rank's word says the root is the one it passed (at two ranks both ranks raise; with
more, a rank that passed another root raises, the others wait for it until the timeout).

A rank that raises once it has arrived at the first generation (a mismatch, a failed read, a
timeout, an interrupt) may still have a peer writing into its buffer: that buffer is kept
alive as long as the transport (``PeerReads.keep``), never freed under a peer's write.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...errors import CollectiveMismatchError
from ...reduce_ops import ReduceOp, averager, ufunc_for
from ...reductions.kernels import sum_halves
from ..base import Fingerprint
from . import direct  # which imports this module: its functions are looked up at call time

# At and above these sizes, per world size, a broadcast reads the root where peer reads work
# (at two ranks, splitting the copy with the root's write where writes work too). Measured on
# two cores against the prepared broadcast below it, with the root's data rewritten before each
# call: the split single copy took 1.5-1.8x its time at 256 KiB and 1.2x at 512 KiB
# (benchmarks/RESULTS.md), so it starts at 1 MiB; at p = 3 the read-only form was slower up to
# 4 MiB (ranks outnumber cores), so other world sizes keep the workspace broadcast.
BROADCAST_MIN_BYTES = {2: 1 << 20}
ROOT_FLAG = 1 << 62  # above every user-space address: "this rank is the broadcast's root"
MAX_PLANS = 256  # shapes whose chunks are kept (``_plan``); past this the cache starts afresh

Combine = Callable[[np.ndarray, list, np.ndarray], None]


def _combine_for(dtype: np.dtype, op: ReduceOp, p: int, rank: int) -> Combine:
    """``combine(own, operands, acc)``: ``own`` = the reduction of ``operands`` (rank order,
    ``own`` among them) with the bits of the workspace algorithm for ``p`` ranks; ``acc`` is
    scratch of ``own``'s length for more than two ranks."""
    if p == 2:
        pair = direct.pair_round(dtype, op, rank)
        other = 1 - rank
        return lambda own, operands, acc: pair(own, operands[other])
    if direct.sums_halves(dtype, op):
        divisor = p if op is ReduceOp.AVERAGE else 0
        return lambda own, operands, acc: sum_halves(own, operands, divisor)
    ufunc = ufunc_for(op)
    scale, factor = averager(dtype, p)
    average = op is ReduceOp.AVERAGE

    def combine(own: np.ndarray, operands: list, acc: np.ndarray) -> None:
        # own is one of the operands: the partial results go to acc until the last step
        ufunc(operands[0], operands[1], out=acc)
        for other in operands[2:-1]:
            ufunc(acc, other, out=acc)
        ufunc(acc, operands[-1], out=own)
        if average:  # the sum divided as the workspace algorithm divides it
            scale(own, factor, out=own)
    return combine


def _plan(reads: Any, dtype: np.dtype, n: int, op: ReduceOp, chunk_bytes: int, p: int,
          rank: int) -> tuple:
    """What a call of one shape needs, worked out once: this rank's chunks (start, stop, own
    slice's scratch rows), the owners' slices (peer, start, stop) and the combining step."""
    key = (dtype, n, op, chunk_bytes)
    plan = reads.plans.get(key)
    if plan is None:
        if len(reads.plans) >= MAX_PLANS:
            reads.plans.clear()
        itemsize = dtype.itemsize
        lo, hi = direct.slice_of(n, p, rank, itemsize)
        step = min(max(1, chunk_bytes // itemsize), max(hi - lo, 1))
        scratch = reads.scratch(dtype, p * step)
        rows = [scratch[q * step:(q + 1) * step] for q in range(p)]  # row `rank`: acc
        chunks = tuple((a, min(a + step, hi), tuple(row[:min(a + step, hi) - a] for row in rows))
                       for a in range(lo, hi, step))
        owners = tuple((q,) + direct.slice_of(n, p, q, itemsize) for q in range(p) if q != rank)
        plan = reads.plans[key] = (chunks, owners, _combine_for(dtype, op, p, rank))
    return plan


def all_reduce(c: Any, buf: np.ndarray, op: ReduceOp, fp: Fingerprint, chunk_bytes: int) -> None:
    """Reduce ``buf`` (1-D, C-contiguous, writable) over every rank in place by peer reads."""
    t = c.t
    reads, p, rank = t.peer_reads, c.world_size, c.rank
    ctrl, words = t.ctrl, reads.buffer_words
    itemsize = buf.itemsize
    chunks, owners, combine = _plan(reads, buf.dtype, buf.size, op, chunk_bytes, p, rank)
    ctrl[words[rank]] = buf.ctypes.data
    gen, sig = c.begin(fp, buf.nbytes)
    read, write, name, seq = reads.read, reads.write, fp.op, fp.seq
    writes = reads.writable
    try:
        c.sync(gen, fp, sig)  # once this rank arrived, its peers may write into ``buf``
        addresses = [ctrl[w] for w in words]
        for a, b, rows in chunks:
            own = buf[a:b]
            operands = []
            for q in range(p):
                if q == rank:
                    operands.append(own)
                else:
                    read(q, addresses[q] + a * itemsize, rows[q], name, seq)
                    operands.append(rows[q])
            combine(own, operands, rows[rank])
            if writes:  # the chunk's result, still in this core's cache, into every peer
                for q, _, _ in owners:
                    write(q, addresses[q] + a * itemsize, own, name, seq)
        c.sync(gen + 1, fp)
    except BaseException:
        if writes:
            reads.keep(buf)
        raise
    if writes:
        return  # every owner wrote its slice into this buffer before arriving
    for q, q_lo, q_hi in owners:
        read(q, addresses[q] + q_lo * itemsize, buf[q_lo:q_hi], name, seq)
    c.sync(gen + 2, fp)


def broadcast(c: Any, data: np.ndarray, root: int, fp: Fingerprint) -> None:
    """Copy ``root``'s bytes ``data`` into every rank's ``data`` by reading the root's; at two
    ranks where peer writes work, the root writes the first ``root_writes`` bytes into the
    reader's buffer while the reader reads the rest."""
    t, rank = c.t, c.rank
    reads = t.peer_reads
    ctrl, words = t.ctrl, reads.buffer_words
    ctrl[words[rank]] = data.ctypes.data | (ROOT_FLAG if rank == root else 0)
    gen, sig = c.begin(fp, data.size)
    split = root_writes(data.size) if c.world_size == 2 and reads.writable else 0
    try:
        c.sync(gen, fp, sig)  # once this rank arrived, a root may write into ``data``
        roots = [q for q, w in enumerate(words) if ctrl[w] & ROOT_FLAG]
        if roots != [root]:  # the public calls' fingerprints name the root; a direct caller's not
            raise CollectiveMismatchError(
                f"broadcast of {data.size} bytes: rank {rank} takes rank {root} as the root, "
                f"the ranks that say they are the root are {roots} ({fp.describe()})",
                rank=rank, op=fp.op, seq=fp.seq)
        if rank == root:
            if split:
                reads.write(1 - rank, ctrl[words[1 - rank]], data[:split], fp.op, fp.seq)
        else:
            reads.read(root, (ctrl[words[root]] & ~ROOT_FLAG) + split, data[split:], fp.op,
                       fp.seq)
        c.sync(gen + 1, fp)
    except BaseException:
        if split and rank != root:
            reads.keep(data)
        raise


def root_writes(nbytes: int) -> int:
    """How many of a two-rank broadcast's ``nbytes`` the root writes into the reader (the
    reader reads the rest): half, on a cache line. With the root's data fresh in its cache the
    two copies run at once on two cores; measured at p = 2 against the reader reading all of
    it, in turns (``benchmarks/bench_collectives.py --collectives broadcast``): see
    docs/collectives.md."""
    return nbytes // 2 // 64 * 64
