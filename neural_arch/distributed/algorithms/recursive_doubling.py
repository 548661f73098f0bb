"""Recursive-doubling all-reduce: log2(n) rounds, the latency-optimal choice for small messages.

With a world size that is not a power of two, the first ``2 * extra`` ranks pair up: each even
rank hands its data to the odd rank above it, sits out the doubling rounds and gets the result
back at the end. In every combine the operand from the lower ranks goes first, so partners
compute the same bits and every rank ends with an identical result.
"""
from __future__ import annotations

import numpy as np

from ..reduce_ops import ReduceOp, combiner
from ..transports.base import Fingerprint, Transport
from .exchange import exchange, recv, segment_elems, send


def _all_reduce_piece(t: Transport, buf: np.ndarray, scratch: np.ndarray, op: ReduceOp,
                      fp: Fingerprint) -> None:
    n, r = t.world_size, t.rank
    combine = combiner(op, buf.dtype)
    pow2 = 1 << (n.bit_length() - 1)
    extra = n - pow2
    other = scratch[:buf.size]
    if r < 2 * extra:
        if r % 2 == 0:
            send(t, buf, r + 1, fp)
            recv(t, buf, r + 1, fp)
            return
        recv(t, other, r - 1, fp)
        combine(other, buf, out=buf)
        vrank = r // 2
    else:
        vrank = r - extra
    mask = 1
    while mask < pow2:
        vpeer = vrank ^ mask
        peer = 2 * vpeer + 1 if vpeer < extra else vpeer + extra
        exchange(t, buf, peer, other, peer, fp)
        if vpeer < vrank:
            combine(other, buf, out=buf)
        else:
            combine(buf, other, out=buf)
        mask <<= 1
    if r < 2 * extra:
        send(t, buf, r - 1, fp)


def all_reduce(t: Transport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """In-place all-reduce; large buffers are processed one segment at a time."""
    if t.world_size == 1 or buf.size == 0:
        return
    seg = segment_elems(buf.itemsize)
    scratch = np.empty(min(seg, buf.size), dtype=buf.dtype)
    for lo in range(0, buf.size, seg):
        _all_reduce_piece(t, buf[lo:lo + seg], scratch, op, fp)
