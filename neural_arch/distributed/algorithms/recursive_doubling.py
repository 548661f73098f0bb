"""Recursive-doubling all-reduce: log2(n) rounds, the latency-optimal choice for small messages.

With a world size that is not a power of two, the first ``2 * extra`` ranks pair up: each even
rank hands its data to the odd rank above it, sits out the doubling rounds and gets the result
back at the end. In every combine the operand from the lower ranks goes first, so partners
compute the same bits and every rank ends with an identical result.

A piece is at most one segment (``exchange.segment_elems``), so each of its messages is the one
transport call that ``exchange``, ``send`` and ``recv`` would make for it: the piece calls the
transport directly, since on a vector of a few bytes cutting it into pieces costs more than
the transport's own call. A vector of one segment, the common case, is not sliced at all.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ..reduce_ops import ReduceOp, combiner
from ..transports.base import Fingerprint, Transport
from . import exchange


def _all_reduce_piece(t: Transport, buf: np.ndarray, other: np.ndarray,
                      combine: Callable[..., Any], fp: Fingerprint) -> None:
    """All-reduce ``buf`` (at most one segment) in place; ``other`` (as large) receives."""
    n, r = t.world_size, t.rank
    pow2 = 1 << (n.bit_length() - 1)
    extra = n - pow2
    if r < 2 * extra:
        if r % 2 == 0:
            t.send(buf, r + 1, fp)
            t.recv(buf, r + 1, fp)
            return
        t.recv(other, r - 1, fp)
        combine(other, buf, out=buf)
        vrank = r // 2
    else:
        vrank = r - extra
    mask = 1
    while mask < pow2:
        vpeer = vrank ^ mask
        peer = 2 * vpeer + 1 if vpeer < extra else vpeer + extra
        t.sendrecv(buf, peer, other, peer, fp)
        if vpeer < vrank:
            combine(other, buf, out=buf)
        else:
            combine(buf, other, out=buf)
        mask <<= 1
    if r < 2 * extra:
        t.send(buf, r - 1, fp)


def all_reduce(t: Transport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """In-place all-reduce; large buffers are processed one segment at a time."""
    if t.world_size == 1 or buf.size == 0:
        return
    combine = combiner(op, buf.dtype)
    if buf.nbytes <= exchange.SEGMENT_BYTES:  # one piece
        _all_reduce_piece(t, buf, np.empty(buf.size, buf.dtype), combine, fp)
        return
    seg = exchange.segment_elems(buf.itemsize)
    scratch = np.empty(seg, dtype=buf.dtype)
    for lo in range(0, buf.size, seg):
        piece = buf[lo:lo + seg]
        _all_reduce_piece(t, piece, scratch[:piece.size], combine, fp)
