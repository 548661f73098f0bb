"""The tcp transport's own collectives for a job of two ranks: the portable algorithms'
messages and bits, pipelined.

The portable ring all-reduce moves a vector in pieces of ``SEGMENT_BYTES`` and waits for each
piece: send it, receive the peer's, reduce, and only then start the next. Every piece is a
rendezvous of the two ranks, and while one reduces, its socket sits idle. Here the whole
collective is one poll loop (``TcpTransport.send_recv_chained``): every piece of the first half
(the reduce-scatter) is queued at once, each received piece is reduced the moment it is
complete and its result is queued straight back (the all-gather), while the kernel keeps
delivering the next piece into the socket buffer. The messages are the ring's, piece for piece
and in the same order, and every piece is reduced as the ring reduces it (the peer's operand
first, the mean taken on the finished piece), so the results are the ring's bit for bit.

Below ``DIRECT_BELOW_BYTES`` one exchange of the whole vector is cheaper than the ring's two
(one round trip instead of two): that is recursive doubling, whose bits it keeps as well (rank
0's operand first). Broadcast, all-gather, reduce-scatter and barrier send the portable
algorithms' messages too; each direction of a collective runs in one loop.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator, List, Optional, Tuple

import numpy as np

from ..reduce_ops import ReduceOp, combiner, divide_by_count
from ..reductions.kernels import pair_mean_half
from .base import Fingerprint, Message, pair_broadcast, swap_with_root

if TYPE_CHECKING:  # tcp imports this module to return PairCollectives
    from .tcp import TcpTransport
    from .tcp_messages import ChainedRecv

SEGMENT_BYTES = 1 << 20  # the portable algorithms' piece (``algorithms.exchange``)
DIRECT_BELOW_BYTES = 64 * 1024  # their switch from recursive doubling to the ring


def _segments(length: int, seg: int) -> Iterator[slice]:
    """The non-empty pieces of ``length`` elements, ``seg`` at most each."""
    for lo in range(0, length, seg):
        yield slice(lo, min(lo + seg, length))


class PairCollectives:
    """``native_collectives()`` of a two-rank tcp transport (see the module docstring)."""

    name = "native"
    preferred = True

    def __init__(self, transport: TcpTransport) -> None:
        if transport.world_size != 2:
            raise ValueError(f"PairCollectives serve two ranks, not {transport.world_size}")
        self._t, self._peer = transport, 1 - transport.rank
        self._scratch = np.empty(0, np.uint8)  # the peer's pieces land here to be reduced

    def _incoming(self, dtype: np.dtype, count: int) -> np.ndarray:
        """``count`` elements of ``dtype`` to receive into, kept between calls: a fresh
        megabyte is page-faulted in again on every call."""
        nbytes = count * dtype.itemsize
        if self._scratch.nbytes < nbytes:
            self._scratch = np.empty(nbytes, np.uint8)
        return self._scratch[:nbytes].view(dtype)

    # ---- all-reduce ------------------------------------------------------------------------
    def all_reduce(self, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> np.ndarray:
        if buf.size == 0:
            return buf
        summed = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
        if buf.nbytes < DIRECT_BELOW_BYTES:
            other = self._incoming(buf.dtype, buf.size)
            self._t.sendrecv(buf, self._peer, other, self._peer, fp)
            combine = combiner(summed, buf.dtype)
            first, second = (buf, other) if self._t.rank == 0 else (other, buf)
            combine(first, second, out=buf)  # rank 0's operand first, as recursive doubling
            if op is ReduceOp.AVERAGE:
                divide_by_count(buf, 2)
            return buf
        half = -(-buf.size // 2)  # the ring's chunks: the larger one first
        chunks = (buf[:half], buf[half:])
        mine, theirs = chunks[self._t.rank], chunks[self._peer]
        seg = max(1, SEGMENT_BYTES // buf.itemsize)
        fold = _piece_folder(summed, op is ReduceOp.AVERAGE, buf.dtype)
        incoming = self._incoming(buf.dtype, min(seg, mine.size))
        peer = self._peer
        # A receive starts only once the one before it finished and its follow-up ran, so
        # every piece can land in the same ``incoming``.
        recvs: List[ChainedRecv] = []
        for part in _segments(mine.size, seg):
            acc = mine[part]
            got = incoming[:acc.size]
            recvs.append((got, peer, fp, _then_send(fold, got, acc, peer, fp)))
        # The peer sends its reduced piece k back only after it received our piece k whole,
        # so the all-gather overwrites no piece of ``theirs`` that is still to be sent.
        recvs += [(theirs[part], peer, fp, None) for part in _segments(theirs.size, seg)]
        self._t.send_recv_chained([(theirs[part], peer, fp)
                                   for part in _segments(theirs.size, seg)], recvs)
        return buf

    # ---- the other collectives -------------------------------------------------------------
    def reduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                       fp: Fingerprint) -> np.ndarray:
        m = recvbuf.size
        if sendbuf.size != 2 * m:
            raise ValueError(f"reduce_scatter needs 2 x {m} = {2 * m} input elements for a "
                             f"{m}-element output, got {sendbuf.size}")
        if m == 0:
            return recvbuf
        if np.shares_memory(sendbuf, recvbuf):  # the pieces to send must stay as they were
            sendbuf = sendbuf.copy()
        rank, peer = self._t.rank, self._peer
        mine, theirs = sendbuf[rank * m:(rank + 1) * m], sendbuf[peer * m:(peer + 1) * m]
        seg = max(1, SEGMENT_BYTES // sendbuf.itemsize)
        combine = combiner(ReduceOp.SUM if op is ReduceOp.AVERAGE else op, sendbuf.dtype)
        incoming = self._incoming(sendbuf.dtype, min(seg, m))
        if m <= seg:  # one piece each way: the same message as a chained one, fewer steps
            self._t.sendrecv(theirs, peer, incoming, peer, fp)
            _then_reduce(combine, op, incoming, mine, recvbuf)()
            return recvbuf
        recvs: List[ChainedRecv] = []
        for part in _segments(m, seg):
            got = incoming[:part.stop - part.start]
            recvs.append((got, peer, fp, _then_reduce(combine, op, got, mine[part],
                                                      recvbuf[part])))
        self._t.send_recv_chained([(theirs[part], peer, fp) for part in _segments(m, seg)],
                                  recvs)
        return recvbuf

    def all_gather(self, sendbuf: np.ndarray, recvbuf: np.ndarray,
                   fp: Fingerprint) -> np.ndarray:
        m = sendbuf.size
        if recvbuf.size != 2 * m:
            raise ValueError(f"all_gather needs an output of 2 x {m} = {2 * m} elements, "
                             f"got {recvbuf.size}")
        rank, peer = self._t.rank, self._peer
        np.copyto(recvbuf[rank * m:(rank + 1) * m], sendbuf)
        if m:
            self._move(recvbuf[rank * m:(rank + 1) * m], recvbuf[peer * m:(peer + 1) * m], fp)
        return recvbuf

    def broadcast(self, buf: np.ndarray, root: int, fp: Fingerprint) -> np.ndarray:
        """The root check and a small payload in one exchange (``base.pair_broadcast``); above its
        limit the root check alone (an exchange of roots, ``base.swap_with_root``), then the
        root's pieces to the other rank."""
        if pair_broadcast(self._t, buf, root, fp):
            return buf
        swap_with_root(self._t, root, fp, None, 0)
        if buf.size:
            self._move(buf if self._t.rank == root else None,
                       None if self._t.rank == root else buf, fp)
        return buf

    def barrier(self, fp: Fingerprint) -> None:
        self._t.sendrecv(np.ones(1, np.uint8), self._peer, np.empty(1, np.uint8), self._peer,
                         fp)

    def _move(self, out: Optional[np.ndarray], into: Optional[np.ndarray],
              fp: Fingerprint) -> None:
        """Send ``out`` and receive ``into`` (either may be None) in the portable pieces, all in
        one loop."""
        def pieces(buf: Optional[np.ndarray]) -> List[Message]:
            if buf is None:
                return []
            seg = max(1, SEGMENT_BYTES // buf.itemsize)
            return [(buf[part], self._peer, fp) for part in _segments(buf.size, seg)]
        self._t.send_recv_many(pieces(out), pieces(into))


Folder = Callable[[np.ndarray, np.ndarray], None]


def _piece_folder(summed: ReduceOp, mean: bool, dtype: np.dtype) -> Folder:
    """``fold(got, acc)``: ``acc = got op acc``, then halved for a mean: the ring's piece."""
    combine = combiner(summed, dtype)
    if not mean:
        return lambda got, acc: combine(got, acc, out=acc)
    if dtype == np.float16:  # one compiled pass, the same two roundings to float16
        return lambda got, acc: pair_mean_half(acc, got, 0.5, False)

    def add_then_halve(got: np.ndarray, acc: np.ndarray) -> None:
        combine(got, acc, out=acc)
        divide_by_count(acc, 2)
    return add_then_halve


def _then_send(fold: Folder, got: np.ndarray, acc: np.ndarray, peer: int,
               fp: Fingerprint) -> Callable[[], Tuple[Message, ...]]:
    def then() -> Tuple[Message, ...]:
        fold(got, acc)
        return ((acc, peer, fp),)
    return then


def _then_reduce(combine, op: ReduceOp, got: np.ndarray, mine: np.ndarray,
                 out: np.ndarray) -> Callable[[], Tuple[Message, ...]]:
    def then() -> Tuple[Message, ...]:
        combine(got, mine, out=out)
        if op is ReduceOp.AVERAGE:
            divide_by_count(out, 2)
        return ()
    return then
