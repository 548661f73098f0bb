"""Direct collectives through the shared-memory transport's workspace.

Each collective is a few generations of a barrier on per-rank arrival counters
(``shm_generations``): before arriving a rank writes only its own input area of the current
half of the workspace (a broadcast root all of them); after everyone arrived it reads any
input area of that half and writes only its own slice of the result area.

All-reduce: every element is reduced by exactly one rank, over ranks 0..p-1 in that order, and
copied by everyone from the shared result: results are bit-identical on all ranks. Two ranks
instead both reduce everything, with the operands in the same order. Vectors up to SMALL_BYTES
take a one-barrier path in which every rank reduces the whole vector in that same order; that
path, and broadcasts and all-gathers of up to SMALL_BYTES (one round), are prepared once per
shape (``shm_prepared``), and compiled once they run often (``shm_compiled``).
"""
from __future__ import annotations

from functools import partial

import numpy as np

from ..reduce_ops import (ReduceOp, as_reduce_op, averager, check_dtype_for_op, divide_by_count,
                          ufunc_for)
from ..transports.base import Fingerprint
from ..transports.shm import ShmTransport
from . import shm_compiled, shm_prepared
from .shm_generations import begin, sync, workspace_views

# Measured at p = 2 and 4 on two cores: up to ~128 KiB one barrier with every rank reducing the
# whole vector beats two barriers with a 1/p share each; 1 MiB rounds keep large vectors in
# cache, and let a broadcast's root fill one half of the workspace while the others read the
# other (4 and 16 MiB broadcasts at p = 2 took 1.3-1.5x as long in one round per workspace).
SMALL_BYTES = 128 << 10     # at or below: every rank reduces the whole vector, one barrier
ROUND_BYTES = 1 << 20       # all-reduce data per round (split in p slices), broadcast data
ALIGN_BYTES = 64            # slice boundaries fall on cache lines
MAX_CACHED_SHAPES = 1024    # small-vector views kept per transport


def supports_direct(t) -> bool:
    """Whether ``t`` is an open shared-memory transport (its group is its whole world)."""
    return isinstance(t, ShmTransport) and not t._closed


def _flat(buf, what: str, writable: bool = False) -> np.ndarray:
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} must be a NumPy array, got {type(buf).__name__}")
    if buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError(f"{what} must be a 1-D C-contiguous array, got shape {buf.shape} "
                         f"with strides {buf.strides}")
    if writable and not buf.flags.writeable:
        raise ValueError(f"{what} must be writable (shape {buf.shape}, dtype {buf.dtype})")
    return buf


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _slice(m: int, p: int, rank: int, itemsize: int) -> tuple[int, int]:
    """This rank's part of ``m`` elements: cache-line aligned, the last parts may be empty."""
    align = max(1, ALIGN_BYTES // itemsize)
    per = _ceil_div(_ceil_div(m, p), align) * align
    return min(rank * per, m), min((rank + 1) * per, m)


# ----- all-reduce -----------------------------------------------------------------------------
def all_reduce(t: ShmTransport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """Reduce ``buf`` over all ranks in place; bit-identical results everywhere."""
    try:
        small = t.direct_views.get((buf.dtype, buf.size, op))
    except AttributeError:
        small = None  # not an array: _flat names the problem
    if small is not None and buf.ndim == 1:
        flags = buf.flags
        if flags.c_contiguous and flags.writeable:
            small(buf, fp)
            return
    _flat(buf, "all_reduce buffer", writable=True)
    given, op = op, as_reduce_op(op)
    check_dtype_for_op(buf.dtype, op)
    if t.world_size == 1:
        return
    if buf.nbytes <= min(SMALL_BYTES, t.layout.workspace_bytes):
        if len(t.direct_views) > MAX_CACHED_SHAPES:
            t.direct_views.clear()
        key = (buf.dtype, buf.size, given)  # keyed as callers name the op
        small = t.direct_views[key] = shm_compiled.tiered(
            t, key, shm_prepared.all_reduce(t, buf.dtype, buf.size, op),
            partial(shm_compiled.all_reduce, t, buf.dtype, buf.size, op),
            shm_compiled.may_compile_all_reduce(buf.dtype, op))
        small(buf, fp)
        return
    if t.world_size == 2:
        _pair_all_reduce(t, buf, op, fp)
    else:
        _large_all_reduce(t, buf, op, fp)


def _pair_all_reduce(t: ShmTransport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """Two ranks: both reduce every round whole, as ``x0 op x1`` with the same operands in the
    same order (so both get the same bits). Each rank copies its round into the workspace and
    nothing back out, one barrier a round; splitting the work takes a copy out and a barrier
    more, and was slower at every size tried, 256 KiB to 64 MiB."""
    inputs, _ = workspace_views(t, buf.dtype)
    ufunc, rank = ufunc_for(op), t.rank
    average = op is ReduceOp.AVERAGE
    scale, factor = averager(buf.dtype, 2)
    step = min(ROUND_BYTES, t.layout.workspace_bytes) // buf.itemsize
    gen, sig = begin(t, fp, buf.nbytes)
    for lo in range(0, buf.size, step):
        part = buf[lo:lo + step]
        areas = inputs[gen & 1]
        t.area_writer.write(areas[rank][:part.size], part)
        sync(t, gen, fp, sig if lo == 0 else 0)
        other = areas[1 - rank][:part.size]
        if rank == 0:
            ufunc(part, other, out=part)
        else:
            ufunc(other, part, out=part)
        if average:
            scale(part, factor, out=part)
        gen += 1


def _large_all_reduce(t: ShmTransport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    p, rank, itemsize = t.world_size, t.rank, buf.itemsize
    inputs, results = workspace_views(t, buf.dtype)
    ufunc, average = ufunc_for(op), op is ReduceOp.AVERAGE
    scale, factor = averager(buf.dtype, p)
    step = min(ROUND_BYTES, t.layout.workspace_bytes) // itemsize
    rounds = _ceil_div(buf.size, step)
    gen, sig = begin(t, fp, buf.nbytes)
    prev = None  # (start, stop, own slice) of the previous round, copied out after its barrier
    for k in range(rounds + 1):
        half = gen & 1
        if k < rounds:
            lo, hi = k * step, min((k + 1) * step, buf.size)
            m = hi - lo
            s_lo, s_hi = _slice(m, p, rank, itemsize)
            mine = inputs[half][rank]
            # peers reduce the other slices; this rank's own slice needs no copy
            t.area_writer.write(mine[:s_lo], buf[lo:lo + s_lo])
            t.area_writer.write(mine[s_hi:m], buf[lo + s_hi:hi])
        sync(t, gen, fp, sig if k == 0 else 0)
        if prev is not None:
            p_lo, p_hi, p_s_lo, p_s_hi = prev
            done = results[half ^ 1]
            buf[p_lo:p_lo + p_s_lo] = done[:p_s_lo]
            buf[p_lo + p_s_hi:p_hi] = done[p_s_hi:p_hi - p_lo]
        if k < rounds:
            if s_hi > s_lo:
                out = results[half][s_lo:s_hi]
                operands = [buf[lo + s_lo:lo + s_hi] if r == rank else inputs[half][r][s_lo:s_hi]
                            for r in range(p)]
                ufunc(operands[0], operands[1], out=out)
                for other in operands[2:]:
                    ufunc(out, other, out=out)
                if average:
                    scale(out, factor, out=out)
                buf[lo + s_lo:lo + s_hi] = out
            prev = (lo, hi, s_lo, s_hi)
        gen += 1


# ----- broadcast, all-gather, reduce-scatter, barrier ----------------------------------------
def broadcast(t: ShmTransport, buf: np.ndarray, root: int, fp: Fingerprint) -> None:
    """Copy ``root``'s ``buf`` into every rank's ``buf`` in place."""
    _flat(buf, "broadcast buffer", writable=t.rank != root)
    if not isinstance(root, (int, np.integer)) or not 0 <= root < t.world_size:
        raise ValueError(f"broadcast root {root!r} is outside 0..{t.world_size - 1}")
    if t.world_size == 1:
        return
    data = buf.view(np.uint8)
    if data.size <= min(SMALL_BYTES, t.layout.workspace_bytes):
        key = ("broadcast", data.size, int(root))
        small = t.direct_views.get(key)
        if small is None:
            if len(t.direct_views) > MAX_CACHED_SHAPES:
                t.direct_views.clear()
            small = t.direct_views[key] = shm_compiled.tiered(
                t, key, shm_prepared.broadcast(t, data.size, int(root)),
                partial(shm_compiled.broadcast, t, data.size, int(root)))
        small(data, fp)
        return
    # the input areas of one half are contiguous: the root fills up to all of them each round
    step = min(t.world_size * t.layout.workspace_bytes, ROUND_BYTES)
    rounds = max(1, _ceil_div(data.size, step))
    gen, sig = begin(t, fp, data.size)
    for k in range(rounds):
        lo, hi = k * step, min((k + 1) * step, data.size)
        start = t.layout.ws_input(gen & 1, 0)
        if t.rank == root:
            t.area_writer.write(t.shared[start:start + hi - lo], data[lo:hi])
        sync(t, gen, fp, sig if k == 0 else 0)
        if t.rank != root:
            data[lo:hi] = t.shared[start:start + hi - lo]
        gen += 1


def all_gather(t: ShmTransport, sendbuf: np.ndarray, recvbuf: np.ndarray,
               fp: Fingerprint) -> None:
    """``recvbuf`` (world_size x len(sendbuf), rank order) receives every rank's ``sendbuf``."""
    try:
        small = t.direct_views.get(("all_gather", sendbuf.dtype, sendbuf.size))
    except AttributeError:
        small = None  # not an array: _flat names the problem
    if (small is not None and recvbuf.dtype == sendbuf.dtype and sendbuf.ndim == recvbuf.ndim == 1
            and recvbuf.size == t.world_size * sendbuf.size and sendbuf.flags.c_contiguous
            and recvbuf.flags.c_contiguous and recvbuf.flags.writeable):
        small(sendbuf, recvbuf, fp)
        return
    _flat(sendbuf, "all_gather sendbuf")
    _flat(recvbuf, "all_gather recvbuf", writable=True)
    p, n = t.world_size, sendbuf.size
    if recvbuf.size != p * n or recvbuf.dtype != sendbuf.dtype:
        raise ValueError(f"all_gather recvbuf must hold {p} x {n} {sendbuf.dtype} elements, got "
                         f"{recvbuf.size} {recvbuf.dtype}")
    if p == 1:
        recvbuf[:] = sendbuf
        return
    if sendbuf.nbytes <= min(SMALL_BYTES, t.layout.workspace_bytes):
        if len(t.direct_views) > MAX_CACHED_SHAPES:
            t.direct_views.clear()
        key = ("all_gather", sendbuf.dtype, n)
        small = t.direct_views[key] = shm_compiled.tiered(
            t, key, shm_prepared.all_gather(t, sendbuf.dtype, n),
            partial(shm_compiled.all_gather, t, sendbuf.dtype, n))
        small(sendbuf, recvbuf, fp)
        return
    src, dst = sendbuf.view(np.uint8), recvbuf.view(np.uint8)
    nbytes, step = src.size, t.layout.workspace_bytes
    inputs, _ = workspace_views(t, np.dtype(np.uint8))
    rounds = max(1, _ceil_div(nbytes, step))
    own = dst[t.rank * nbytes:(t.rank + 1) * nbytes]
    in_place = own.ctypes.data == src.ctypes.data  # sendbuf is this rank's block of recvbuf
    peers = t.layout.peers[t.rank]
    gen, sig = begin(t, fp, nbytes)
    for k in range(rounds):
        lo, hi = k * step, min((k + 1) * step, nbytes)
        areas = inputs[gen & 1]
        t.area_writer.write(areas[t.rank][:hi - lo], src[lo:hi])
        if not in_place:  # while the peers may still be copying theirs in
            own[lo:hi] = src[lo:hi]
        sync(t, gen, fp, sig if k == 0 else 0)
        for r in peers:
            dst[r * nbytes + lo:r * nbytes + hi] = areas[r][:hi - lo]
        gen += 1


def reduce_scatter(t: ShmTransport, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   fp: Fingerprint) -> None:
    """``recvbuf`` (length n) receives chunk ``rank`` of the reduction of ``sendbuf`` (p x n)."""
    _flat(sendbuf, "reduce_scatter sendbuf")
    _flat(recvbuf, "reduce_scatter recvbuf", writable=True)
    op = as_reduce_op(op)
    check_dtype_for_op(sendbuf.dtype, op)
    p, rank, n = t.world_size, t.rank, recvbuf.size
    if sendbuf.size != p * n or recvbuf.dtype != sendbuf.dtype:
        raise ValueError(f"reduce_scatter sendbuf must hold {p} x {n} {recvbuf.dtype} elements, "
                         f"got {sendbuf.size} {sendbuf.dtype}")
    if p == 1:
        recvbuf[:] = sendbuf
        return
    ufunc, itemsize = ufunc_for(op), sendbuf.itemsize
    inputs, _ = workspace_views(t, sendbuf.dtype)
    step = t.layout.workspace_bytes // p // itemsize
    align = max(1, ALIGN_BYTES // itemsize)
    if step > align:
        step = step // align * align
    rounds = max(1, _ceil_div(n, step))
    # an in-place call (recvbuf inside sendbuf) must not overwrite this rank's own piece
    # before reading it, so then that piece goes through the workspace too
    own_in_shm = np.may_share_memory(sendbuf, recvbuf)
    gen, sig = begin(t, fp, sendbuf.nbytes)
    for k in range(rounds):
        lo, hi = k * step, min((k + 1) * step, n)
        m = hi - lo
        mine = inputs[gen & 1][rank]
        for r in range(p):
            if r != rank or own_in_shm:
                t.area_writer.write(mine[r * step:r * step + m], sendbuf[r * n + lo:r * n + hi])
        sync(t, gen, fp, sig if k == 0 else 0)
        operands = [sendbuf[rank * n + lo:rank * n + hi] if r == rank and not own_in_shm
                    else inputs[gen & 1][r][rank * step:rank * step + m] for r in range(p)]
        out = recvbuf[lo:hi]
        ufunc(operands[0], operands[1], out=out)
        for other in operands[2:]:
            ufunc(out, other, out=out)
        if op is ReduceOp.AVERAGE:
            divide_by_count(out, p)
        gen += 1


def barrier(t: ShmTransport, fp: Fingerprint) -> None:
    """Return once every rank has called ``barrier`` with the same fingerprint."""
    if t.world_size == 1:
        return
    gen, sig = begin(t, fp, 0)
    sync(t, gen, fp, sig)
