"""The mpi transport's all-reduce for two ranks: the ring's bits in fewer, larger messages.

Up to ``EXCHANGE_MAX_BYTES`` the two ranks swap their whole vectors in one exchange and each
reduces all of it, every element in the ring's operand order: one message each way costs less
than the ring's two steps. The exchange is the transport's ``swap`` (``mpi_swap``): a packed
copy with its header in front, reduced where it landed. Above it the ring's two steps run as
two exchanges of whole halves (``halves_all_reduce``): this rank's half of the peer's vector
arrives in scratch while the peer's half of this one goes out, is folded in, and the reduced
half goes back while the peer's lands in place; once hot, for a float sum, both steps and the
fold run in one compiled call (``MpiTransport.ring_steps``). The portable ring
(``algorithms.ring``) cuts each half into 1 MiB segments sent in batches; at two ranks one
message a half (up to HALF_PIECE_BYTES, which bounds the scratch) measured faster above 512
KiB (1-16 MiB measured, ``benchmarks/mpi_pair_forms.py``).

The pipeline below (from ``PIPELINE_MIN_BYTES``, which no vector reaches unless it is lowered)
is the same two steps as one ``send_recv_chained`` call (``mpi_chained``): the peer's half goes
out in pieces, every receive is posted before its piece arrives (into a few reused slots), and
each piece of this rank's half is reduced the moment it lands and sent straight back while
later pieces are still in flight. It is built for a machine with a core free to move one piece
while another is reduced; with two ranks on two cores it measured slower than the halves.

Each element is reduced exactly as the ring reduces it (the peer's operand first, then the
division of a mean), so every form gives the ring's results bit for bit.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np

from ..scratch import thread_scratch
from ..reduce_ops import ReduceOp, combiner, divide_by_count
from .base import Fingerprint, Message
from .mpi_swap import Fold
from .mpi_wire import SWAP_MAX_BYTES

if TYPE_CHECKING:
    from .mpi import MpiTransport

# Up to this size one exchange of the whole vector is cheaper than the ring's two steps: one
# message each way instead of two, each rank then reducing the whole vector. Measured beside the
# ring at p = 2 with the packed swap (``benchmarks/mpi_pair_forms.py``, four runs on a busy
# 2-core machine, us): 256 KiB 119-561 against 169-936 (swap faster in every run; quietest
# 119/130 against 169/200), 384 KiB 470-938 against 545-1230, 512 KiB 248-1162 against
# 252-1322 (even), 1 MiB 515 against 361 (the ring faster); one quiet run: 64 KiB 57.0 against
# 114.0, 256 KiB 127.6 against 189.2, 1 MiB 410.4 against 359.4. Both forms compiled
# (``mpi_compiled``: the swap, and the two steps as one call), two runs in turns, us: 128 KiB
# 50.9-52.6 against 63.2-66.0, 256 KiB 88.0-89.1 against 95.4-100.5, 384 KiB 135.8-136.2
# against 126.0-129.3, 512 KiB 192.8-207.1 against 157.3-158.2: the halves from above 256 KiB.
# The swap's own limit, which sizes the receive buffers kept per peer; a larger one
# (``benchmarks/mpi_pair_forms.py``'s "swap" form) exchanges with a ``sendrecv`` above it.
EXCHANGE_MAX_BYTES = SWAP_MAX_BYTES
# The pipeline's threshold, out of reach by default: measured in turns at p = 2 on two cores
# (``benchmarks/mpi_pair_forms.py``, two runs, us), the halves took 2739-2975 at 16 MiB against
# the pipeline's 3441-3567 and MPI_Allreduce's 3122-3311, 870-974 at 4 MiB against 1015-1094
# (MPI 718-745), 360-381 at 1 MiB against 449-453 (the portable ring 389-402, MPI 252-274). With
# two ranks on two cores no core is left to move one piece while another is reduced: the
# overlap the pipeline is built for needs a larger machine; tests and the benchmark lower it.
PIPELINE_MIN_BYTES = 1 << 62
# The halves' largest message: the scratch a half arrives in is at most this (the thread's
# scratch never shrinks), and a half above it goes in pieces of this size, the same on both
# ranks, each element reduced as before.
HALF_PIECE_BYTES = 16 << 20
# Pieces: small enough that the first is reduced while the rest of a half is still arriving,
# large enough that MPI's per-message handshake and a Python step per piece stay a small part
# of a piece's transfer. WINDOW_PIECES receive slots bound the scratch memory.
MIN_PIECE_BYTES, MAX_PIECE_BYTES, PIECES_PER_HALF = 256 << 10, 1 << 20, 4
WINDOW_PIECES = 8


def piece_elems(half_elems: int, itemsize: int) -> int:
    """Elements per piece for a half of ``half_elems``: about PIECES_PER_HALF pieces, each
    between MIN_PIECE_BYTES and MAX_PIECE_BYTES."""
    target = -(-half_elems * itemsize // PIECES_PER_HALF)
    return max(1, min(MAX_PIECE_BYTES, max(MIN_PIECE_BYTES, target)) // itemsize)


def _pieces(length: int, piece: int) -> Iterator[slice]:
    for lo in range(0, length, piece):
        yield slice(lo, min(lo + piece, length))


def all_reduce(t: MpiTransport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint,
               mean: int = 0) -> None:
    """The ring all-reduce of ``algorithms.ring`` at two ranks (``op`` already a sum for an
    average, ``mean`` > 0 the divisor) in one exchange, two, or the pipeline, by size;
    ``buf`` is 1-D, contiguous, non-empty."""
    rank, peer = t.rank, 1 - t.rank
    half = -(-buf.size // 2)  # the ring's chunks: the larger one first
    if buf.nbytes <= EXCHANGE_MAX_BYTES:
        exchange_all_reduce(t, buf, half, op, fp, mean)
        return
    mine, theirs = (buf[:half], buf[half:]) if rank == 0 else (buf[half:], buf[:half])
    combine = combiner(op, buf.dtype)
    if buf.nbytes < PIPELINE_MIN_BYTES:
        halves_all_reduce(t, mine, theirs, combine, mean, fp)
        return
    fold = _folder(combine, mean)
    piece = piece_elems(half, buf.itemsize)
    slots = thread_scratch(min(WINDOW_PIECES * piece, mine.size) * buf.itemsize, buf.dtype)
    recvs = []
    for k, part in enumerate(_pieces(mine.size, piece)):
        acc = mine[part]
        lo = (k % WINDOW_PIECES) * piece
        got = slots[lo:lo + acc.size]
        recvs.append((got, peer, fp, _then_send(fold, got, acc, peer, fp)))
    # A piece of ``theirs`` is received into only once its own send completed (mpi_chained).
    recvs += [(theirs[part], peer, fp, None) for part in _pieces(theirs.size, piece)]
    t.send_recv_chained([(theirs[part], peer, fp) for part in _pieces(theirs.size, piece)],
                        recvs)


def halves_all_reduce(t: MpiTransport, mine: np.ndarray, theirs: np.ndarray, combine,
                      mean: int, fp: Fingerprint) -> None:
    """The ring's two steps, each one exchange of a whole half (of pieces of at most
    HALF_PIECE_BYTES, both ranks cutting the same): ``theirs`` goes to the peer while the
    peer's part of ``mine`` arrives in scratch and is folded into ``mine`` (``acc = got
    combine acc``, then divided by ``mean`` unless 0); then ``mine``, reduced, goes back while
    the peer's reduced half lands in ``theirs``. Halves of one piece take both steps in one
    transport call (``ring_steps``: compiled for a float sum). Both ranks count the pieces of
    the larger half (the peer's ``theirs`` is this rank's ``mine``), so a piece of the smaller
    one may be empty."""
    peer, itemsize = 1 - t.rank, mine.itemsize
    step = max(1, HALF_PIECE_BYTES // itemsize)
    longer = max(mine.size, theirs.size)
    got = thread_scratch(min(step, longer) * itemsize, mine.dtype)
    if longer <= step:
        t.ring_steps(mine, theirs, got[:mine.size], fp,
                     Fold(mine, combine, mine.size, True, False, mean))
        return
    fold = _folder(combine, mean)
    for lo in range(0, longer, step):
        part = slice(lo, lo + step)
        acc = mine[part]
        t.sendrecv(theirs[part], peer, got[:acc.size], peer, fp)
        fold(got[:acc.size], acc)
    for lo in range(0, longer, step):
        part = slice(lo, lo + step)
        t.sendrecv(mine[part], peer, theirs[part], peer, fp)


def exchange_all_reduce(t: MpiTransport, buf: np.ndarray, half: int, op: ReduceOp,
                        fp: Fingerprint, mean: int) -> None:
    """The whole vector each way in one exchange, then each element reduced as the ring
    reduces it on the rank that owns its chunk (``half``: the first chunk's length, the larger
    one): the owner's peer's operand first. Up to the wire's ``SWAP_MAX_BYTES`` the exchange is
    the transport's ``swap`` (one message each way, reduced where it landed), above it
    (``EXCHANGE_MAX_BYTES`` raised) a ``sendrecv``."""
    rank = t.rank
    # chunk 0 is rank 0's: rank 1's operand first; chunk 1 rank 1's: rank 0's operand first
    reduce = Fold(buf, combiner(op, buf.dtype), half, rank == 0, rank == 1, mean)
    if buf.nbytes <= SWAP_MAX_BYTES:
        t.swap(buf, 1 - rank, fp, reduce)
        return
    got = thread_scratch(buf.nbytes, buf.dtype)
    t.sendrecv(buf, 1 - rank, got, 1 - rank, fp)
    reduce(got)


def _folder(combine, mean: int) -> Callable[[np.ndarray, np.ndarray], None]:
    """``fold(got, acc)``: ``acc = got op acc``, then divided by ``mean``: the ring's step."""
    if not mean:
        return lambda got, acc: combine(got, acc, out=acc)

    def fold_mean(got: np.ndarray, acc: np.ndarray) -> None:
        combine(got, acc, out=acc)
        divide_by_count(acc, mean)
    return fold_mean


def _then_send(fold, got: np.ndarray, acc: np.ndarray, peer: int,
               fp: Fingerprint) -> Callable[[], tuple[Message, ...]]:
    def then() -> tuple[Message, ...]:
        fold(got, acc)
        return ((acc, peer, fp),)
    return then
