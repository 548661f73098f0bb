"""Ring collectives: bandwidth-optimal reduce-scatter, all-gather and all-reduce.

The buffer is cut into one chunk per rank (sizes differ by at most one element) and every chunk
travels around the ring in pieces of at most ``SEGMENT_BYTES``, the pieces of up to
``WINDOW_SEGMENTS`` of them posted at once. Each chunk is reduced along one fixed path, then
copied to everyone, so all ranks end with the same bits.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..scratch import thread_scratch
from ..reduce_ops import ReduceOp, combiner, divide_by_count
from ..transports.base import Fingerprint, Transport
from .exchange import batch, chunk_bounds, exchange, segment_elems, segment_pairs

# Pieces of one step posted together (``exchange.batch``): the transport moves them back to
# back, where piece by piece each waited for the slower rank to catch up (a rendezvous per
# piece); the window bounds the scratch buffer the reduce-scatter receives into.
WINDOW_SEGMENTS = 8


def _move(t: Transport, out: np.ndarray, right: int, into: np.ndarray, left: int,
          fp: Fingerprint) -> None:
    """Send ``out`` right while receiving ``into`` from the left: one piece by ``exchange``
    (the transport's cheapest call), several as one ``batch``. Both sides cut the same pieces.
    A transport without its own ``send_recv_many`` (the default sends, then receives) keeps to
    ``exchange``: with synchronous sends a batch would deadlock."""
    if (max(out.size, into.size) <= segment_elems(max(out.itemsize, into.itemsize))
            or type(t).send_recv_many is Transport.send_recv_many):
        exchange(t, out, right, into, left, fp)
    else:
        batch(t, [(out, right, fp)], [(into, left, fp)])


def _reduce_scatter_inplace(t: Transport, buf: np.ndarray, bounds: list[tuple[int, int]],
                            op: ReduceOp, fp: Fingerprint, mean: int = 0) -> None:
    """Afterwards chunk ``t.rank`` of ``buf`` holds the reduction of that chunk over all ranks
    (divided by ``mean`` when it is > 0, each window as it is finished, still in cache).

    Chunk ``c`` starts at rank ``c + 1`` and is folded in ring order, arriving complete at rank
    ``c`` after ``n - 1`` steps; other chunks of ``buf`` are left holding partial results.
    """
    n, r = t.world_size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    combine = combiner(op, buf.dtype)
    window = segment_elems(buf.itemsize) * WINDOW_SEGMENTS
    largest = max(hi - lo for lo, hi in bounds)
    incoming = thread_scratch(min(window, largest) * buf.itemsize, buf.dtype)
    for step in range(n - 1):
        s_lo, s_hi = bounds[(r - step - 1) % n]
        r_lo, r_hi = bounds[(r - step - 2) % n]
        outgoing, target = buf[s_lo:s_hi], buf[r_lo:r_hi]
        for out_part, in_part in segment_pairs(s_hi - s_lo, r_hi - r_lo, window):
            acc = target[in_part]
            got = incoming[:acc.size]
            _move(t, outgoing[out_part], right, got, left, fp)
            combine(got, acc, out=acc)
            if mean and step == n - 2:  # the last step completes this rank's own chunk
                divide_by_count(acc, mean)


def _all_gather_inplace(t: Transport, buf: np.ndarray, bounds: list[tuple[int, int]],
                        fp: Fingerprint) -> None:
    """Rank ``r`` contributes chunk ``r`` of ``buf``; afterwards every rank holds every chunk."""
    n, r = t.world_size, t.rank
    right, left = (r + 1) % n, (r - 1) % n
    window = segment_elems(buf.itemsize) * WINDOW_SEGMENTS
    for step in range(n - 1):
        s_lo, s_hi = bounds[(r - step) % n]
        r_lo, r_hi = bounds[(r - step - 1) % n]
        outgoing, target = buf[s_lo:s_hi], buf[r_lo:r_hi]
        for out_part, in_part in segment_pairs(s_hi - s_lo, r_hi - r_lo, window):
            _move(t, outgoing[out_part], right, target[in_part], left, fp)


def all_reduce(t: Transport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint,
               mean: int = 0) -> None:
    """In-place all-reduce of a 1-D contiguous buffer: reduce-scatter, then all-gather. With
    ``mean`` > 0 the result is divided by it (the sum then the division, as ``divide_by_count``
    rounds it), at no pass of its own."""
    if t.world_size == 1 or buf.size == 0:
        return
    if t.ring_all_reduce(buf, op, fp, mean):  # the transport's faster form, these bits
        return
    bounds = chunk_bounds(buf.size, t.world_size)
    _reduce_scatter_inplace(t, buf, bounds, op, fp, mean)
    _all_gather_inplace(t, buf, bounds, fp)


def reduce_scatter(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   fp: Fingerprint) -> None:
    """``recvbuf`` (m elements) gets block ``rank`` of the reduction of every ``sendbuf`` (n*m)."""
    n, m = t.world_size, recvbuf.size
    if sendbuf.size != n * m:
        raise ValueError(f"reduce_scatter needs {n} x {m} = {n * m} input elements for a "
                         f"{m}-element output, got {sendbuf.size}")
    if n == 1:
        np.copyto(recvbuf, sendbuf)
        return
    if m == 0:
        return
    if n == 2 and m <= segment_elems(sendbuf.itemsize):
        # The ring's one step as one exchange, folded straight into ``recvbuf``: no copy of
        # the input, the same message and operand order (the peer's first).
        r = t.rank
        peer = 1 - r
        got = thread_scratch(recvbuf.nbytes, recvbuf.dtype)
        t.sendrecv(sendbuf[peer * m:(peer + 1) * m], peer, got, peer, fp)
        combiner(op, sendbuf.dtype)(got, sendbuf[r * m:(r + 1) * m], out=recvbuf)
        return
    if np.may_share_memory(sendbuf, recvbuf):
        # partials carried in the output would overwrite input not yet read: the ring runs in
        # place on a copy (the caller's input stays intact)
        work = sendbuf.copy()
        bounds = [(i * m, (i + 1) * m) for i in range(n)]
        _reduce_scatter_inplace(t, work, bounds, op, fp)
        np.copyto(recvbuf, work[t.rank * m:(t.rank + 1) * m])
        return
    _reduce_scatter_into(t, sendbuf, recvbuf, op, fp)


def _reduce_scatter_into(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                         fp: Fingerprint) -> None:
    """``_reduce_scatter_inplace``'s messages and operand order with ``recvbuf`` (apart from
    ``sendbuf``) carrying the partial result from step to step: the chunk that arrives at a
    step, folded with this rank's input for it, is the chunk sent at the next, and the last
    step's is this rank's own. The input is only read, so it needs no copy: a copy would be a
    second input-sized buffer on every call (a ZeRO or FSDP step's whole gradient)."""
    n, r, m = t.world_size, t.rank, recvbuf.size
    right, left = (r + 1) % n, (r - 1) % n
    combine = combiner(op, sendbuf.dtype)
    window = segment_elems(sendbuf.itemsize) * WINDOW_SEGMENTS
    incoming = thread_scratch(min(window, m) * sendbuf.itemsize, sendbuf.dtype)
    blocks = sendbuf.reshape(n, m)
    outgoing = blocks[(r - 1) % n]  # the first step sends this rank's input as it is
    for step in range(n - 1):
        mine = blocks[(r - step - 2) % n]  # the chunk arriving now: its own at the last step
        for part, _ in segment_pairs(m, m, window):
            got = incoming[:part.stop - part.start]
            # the window goes out (from recvbuf after the first step) before it is overwritten
            _move(t, outgoing[part], right, got, left, fp)
            combine(got, mine[part], out=recvbuf[part])
        outgoing = recvbuf


def all_gather(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
    """``recvbuf`` (n*m elements) gets every rank's ``sendbuf`` (m elements) in rank order."""
    n, m = t.world_size, sendbuf.size
    if recvbuf.size != n * m:
        raise ValueError(f"all_gather needs an output of {n} x {m} = {n * m} elements, "
                         f"got {recvbuf.size}")
    all_gather_plan(t, m, sendbuf.itemsize)(sendbuf, recvbuf, fp)


def all_gather_plan(t: Transport, m: int, itemsize: int
                    ) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """``run(sendbuf, recvbuf, fp)``: ``all_gather`` for every ``sendbuf`` of ``m`` elements of
    ``itemsize`` bytes on ``t`` (sizes already checked), what those calls share taken once.

    Two ranks with one segment each make the ring's one step as one exchange: the chunk goes
    out while the peer's lands in place, the same message the steps below send, without the
    Python that cuts chunks into pieces (on a few bytes it cost several times the exchange)."""
    n, r = t.world_size, t.rank
    mine = slice(r * m, (r + 1) * m)
    if n == 1 or m == 0:
        return lambda sendbuf, recvbuf, fp: np.copyto(recvbuf[mine], sendbuf)
    if n == 2 and m <= segment_elems(itemsize):
        peer = 1 - r
        theirs = slice(peer * m, (peer + 1) * m)

        def pair(sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
            # sent from its place in the output, as the steps send it: an input that is a
            # view of the output never overlaps the block being received
            np.copyto(recvbuf[mine], sendbuf)
            t.sendrecv(recvbuf[mine], peer, recvbuf[theirs], peer, fp)
        return pair
    bounds = [(i * m, (i + 1) * m) for i in range(n)]

    def steps(sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
        np.copyto(recvbuf[mine], sendbuf)
        _all_gather_inplace(t, recvbuf, bounds, fp)
    return steps
