"""``MpiTransport.swap``: two ranks exchange whole vectors of up to ``SWAP_MAX_BYTES`` in one MPI
message each way, the header and a copy of the payload packed together (``mpi_wire``'s packed
form, at larger sizes), and the caller reads what arrived where it landed.

Why a copy, measured at p = 2 on 2 cores with bare mpi4py (``benchmarks/mpi_layers.py``'s
bare rows, in turns, us): a Sendrecv of 64 KiB and a sum written to the receive buffer take 10,
written back into the sent buffer 55, and the same after sending a copy 23 (MPI's single-copy
transfer reads the sender's memory from the receiving process: writing memory the peer has
just read is what the figures point at). An all-reduce must write its result into the caller's
buffer, so sending a copy is the cheap way; and a copy the sender owns can carry the header in
front of the payload, so each swap is one message each way instead of a header and a payload
sent after it. Both buffers are kept per peer (``FirstBuffers``), the receiver's sized for any
first message of the wire, so a mismatched call (another size, op or collective) is still read
whole and named by its header, never an MPI truncation error. Above ``SWAP_MAX_BYTES`` the copy
costs more than it saves (bare, 1 MiB: 364-398 us against 252-316 without it; the sizes are
``mpi_pair``'s).

This is the swap's mpi4py form; once hot, the transport runs the same messages in one compiled
call (``mpi_compiled``), which reads a ``Fold``'s fields to fold a sum (float32, float64,
int64) itself.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import numpy as np

from ..reduce_ops import divide_by_count
from .base import HEADER_SIZE, Fingerprint, pack_header
from .mpi_wire import TAG, check_first, swap_max_bytes

if TYPE_CHECKING:
    from .mpi import MpiTransport


def swap(t: MpiTransport, sendbuf: np.ndarray, out: memoryview, peer: int, fp: Fingerprint,
         use: Callable[[np.ndarray], None]) -> None:
    """Send ``sendbuf`` (``out``: its bytes) to ``peer`` and receive the peer's vector of the
    same size and dtype; ``use(received)`` runs on it before its buffer is reused. Called with
    the transport's lock held, ``out.nbytes <= swap_max_bytes(t.world_size)``."""
    nbytes, limit = out.nbytes, swap_max_bytes(t.world_size)
    if nbytes > limit:  # the peer's receive buffer holds no more
        raise ValueError(f"swap takes at most {limit} bytes at {t.world_size} ranks, got "
                         f"{nbytes} ({fp.describe()})")
    MPI, comm, status = t.mpi, t.comm, t.status
    header = pack_header(fp, nbytes)
    first, packed = t.first_buffers.take(peer), t.send_buffers.take(peer)
    posted: list = []  # the receive, then the send
    arrived = []

    def advance():
        if not arrived:  # the peer's message is judged as soon as it is here
            if not posted[0].Test(status):
                return posted
            count = status.Get_count(MPI.BYTE)
            arrived.append(count)
            # the common case (the header expected, as long as expected) without a call
            if not (count == HEADER_SIZE + nbytes and first.startswith(header)):
                check_first(t, first, count, peer, fp, nbytes, True)
        return None if sending[0].Test() else sending

    try:
        try:
            posted.append(comm.Irecv([first, MPI.BYTE], peer, TAG))  # first: the peer's finds it
            packed[:HEADER_SIZE] = header
            # through a memoryview: a bytearray's own slice assignment first copies a value
            # that is not a bytearray into a new one, a second copy of the payload
            # (``tests/distributed/test_collective_copies.py`` sees it)
            memoryview(packed)[HEADER_SIZE:HEADER_SIZE + nbytes] = out
            posted.append(comm.Isend([packed, HEADER_SIZE + nbytes, MPI.BYTE], peer, TAG))
            sending = posted[1:]
            done = advance() is None
        except MPI.Exception as e:  # the wait below converts those of its own polls
            t.raise_mpi_error(posted, fp, (peer,), e)
        if not done or t.look_due():
            t.wait_requests(posted, fp, (peer,), advance)
    except BaseException:
        # The peer may still read our message (a mismatched peer does, into its own first
        # buffer), a receive given up may still land: both buffers live as long as the
        # transport, never freed under MPI.
        t.abandoned.append((posted, first, packed))
        raise
    # complete and checked: the payload is what the peer sent, of this call's size and dtype
    use(np.frombuffer(first, sendbuf.dtype, sendbuf.size, HEADER_SIZE))
    t.first_buffers.give(peer, first)
    t.send_buffers.give(peer, packed)


class Fold:
    """``use`` for a swap that reduces: ``buf`` = the peer's vector ``combine`` ``buf``'s, the
    peer's operand first below ``split`` where ``low`` and from ``split`` on where ``high``,
    then divided by ``mean`` where it is not 0. What it does is in its fields, so that the
    compiled swap (``mpi_compiled``) can do the same in its own call.

    A round of recursive doubling (``MpiTransport.exchange_reduce``) folds the whole vector in
    one order (``split`` = the vector's size), the sendrecv form's bits. The swap sends a copy,
    so the fold writes no memory the peer's single-copy transfer has just read, which a
    ``sendrecv`` of ``buf`` itself makes it do (see the module docstring). Measured at p = 2 on
    two cores (``benchmarks/mpi_layers.py``'s public row, two runs of each tree in turns, us):
    16 KiB 49.5-57.8 as a sendrecv against 25.7-26.1 swapped, 32 KiB 44.0-72.5 against
    34.6-35.4; 4 B and 4 KiB (packed either way) within the runs' spread.

    Its messages are those of the two-rank ring's exchange (``mpi_pair``), which folds each
    half in the order of the rank that owns it in the ring: ranks that force the two
    algorithms differently per call are not told apart, and end with the same values, their
    bits differing only where the order shows (the sign of a zero from MAX or MIN, a NaN's
    payload). Below the wire's packed 8 KiB a ``sendrecv`` of that size was such a message
    already. (Ranks forcing them differently through the environment are stopped at
    ``init_process_group``.)"""

    __slots__ = ("buf", "combine", "split", "low", "high", "mean")

    def __init__(self, buf: np.ndarray, combine: Callable, split: int, low: bool, high: bool,
                 mean: int = 0) -> None:
        self.buf, self.combine, self.split = buf, combine, split
        self.low, self.high, self.mean = low, high, mean

    @classmethod
    def of_round(cls, buf: np.ndarray, combine: Callable, theirs_first: bool,
                 mean: int = 0) -> "Fold":
        """The fold of a round of recursive doubling: the whole vector in one order."""
        return cls(buf, combine, buf.size, theirs_first, False, mean)

    def __call__(self, got: np.ndarray) -> None:
        buf, combine, split = self.buf, self.combine, self.split
        if split == buf.size:
            combine(*((got, buf) if self.low else (buf, got)), out=buf)
        else:
            mine, theirs = buf[:split], got[:split]
            combine(*((theirs, mine) if self.low else (mine, theirs)), out=mine)
            mine, theirs = buf[split:], got[split:]
            combine(*((theirs, mine) if self.high else (mine, theirs)), out=mine)
        if self.mean:
            divide_by_count(buf, self.mean)
