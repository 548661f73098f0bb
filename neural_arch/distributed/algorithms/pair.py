"""Two-rank reduce, gather and scatter in one exchange with their root check.

At two ranks the binomial tree (``tree``) is a single message, but the agreement on the root
before it (``agreement``) is a round trip of its own. Up to ``PAIR_ROOTED_MAX_BYTES`` each rank
instead sends the root it passed in front of its part of the data (``swap_with_root``) and
receives the peer's: a reduce's root folds in the other rank's vector, a gather's root places
it, a scatter's other rank keeps its block. The rank whose data nobody needs sends zeros of
the same size, so both messages match and the root check is the same as the agreement's.
Each function returns False (nothing sent) at another world size or above the limit; the
results and their bits are the tree's (a reduce's root's operand first).

A gather's root with an output of the wrong size raises ValueError after the exchange, so
that the other rank is not left waiting; a scatter's root with a wrong input raises before it,
as the tree's does, since the other rank must not take anything for its block.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from ..reduce_ops import ReduceOp, combiner
from ..transports.base import PAIR_ROOTED_MAX_BYTES, Fingerprint, Transport, swap_with_root
from .tree import check_whole


def applies(world_size: int, nbytes: int) -> bool:
    """Whether a rooted collective whose rank's part is ``nbytes`` takes this form."""
    return world_size == 2 and nbytes <= PAIR_ROOTED_MAX_BYTES


def reduce(t: Transport, buf: np.ndarray, root: int, op: ReduceOp, fp: Fingerprint) -> bool:
    """``buf`` of ``root`` becomes the reduction of both ranks' ``buf`` (the other's unchanged)."""
    if not applies(t.world_size, buf.nbytes):
        return False
    mine = t.rank == root
    got = swap_with_root(t, root, fp, None if mine else buf, buf.nbytes)
    if mine and buf.size:
        combiner(op, buf.dtype)(buf, got.view(buf.dtype), out=buf)
    return True


def gather(t: Transport, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray], root: int,
           fp: Fingerprint) -> bool:
    """``recvbuf`` (2 m elements) of ``root`` gets both ranks' ``sendbuf`` (m) in rank order."""
    if not applies(t.world_size, sendbuf.nbytes):
        return False
    got = swap_with_root(t, root, fp, None if t.rank == root else sendbuf, sendbuf.nbytes)
    if t.rank == root:
        m = sendbuf.size
        check_whole(recvbuf, 2, m, "gather root needs an output")
        peer = 1 - root
        np.copyto(recvbuf[root * m:(root + 1) * m], sendbuf)
        recvbuf[peer * m:(peer + 1) * m].view(np.uint8)[:] = got
    return True


def scatter(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray, root: int,
            fp: Fingerprint) -> bool:
    """``recvbuf`` (m elements) gets block ``rank`` of ``root``'s ``sendbuf`` (2 m elements)."""
    if not applies(t.world_size, recvbuf.nbytes):
        return False
    m = recvbuf.size
    if t.rank != root:
        recvbuf.view(np.uint8)[:] = swap_with_root(t, root, fp, None, recvbuf.nbytes)
        return True
    check_whole(sendbuf, 2, m, "scatter root needs an input")
    peer = 1 - root
    swap_with_root(t, root, fp, sendbuf[peer * m:(peer + 1) * m], recvbuf.nbytes)
    np.copyto(recvbuf, sendbuf[root * m:(root + 1) * m])
    return True
