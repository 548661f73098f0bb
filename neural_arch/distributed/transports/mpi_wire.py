"""How the MPI transport puts a message on the wire, and how it takes one off.

Every message starts with the fixed-size header of ``base`` (the fingerprint and the payload
length). A payload of at most ``PACKED_MAX_BYTES`` travels in the same MPI message as its
header, copied behind it: one message costs one MPI send and one receive, where copying a few
KiB costs less than a second message. A two-rank swap (``mpi_swap``) packs up to
``SWAP_MAX_BYTES`` the same way. A larger payload follows its header as messages of its
own, sent and received in place, without a copy. MPI keeps the messages of one sender on one
tag in order, so a header and its payload stay paired.

A receive posts its first MPI receive at once, before the message arrives, into a buffer of
``first_max_bytes``: every first message of this wire fits (a header alone, or a header and a
packed payload, up to a swap's where swaps run), whatever size the sender chose, so no probe is
needed to learn it. Those buffers are kept per peer (``FirstBuffers``) and lent to one receive at a
time: a fresh one per receive cost more than the MPI calls of a small message. A message of
another size than the one expected is still received whole and its header names the sender's
call, so mismatched calls raise ``CollectiveMismatchError`` naming both, never an MPI truncation
error or a wait for a payload that will not come. A payload is received only once its header
was checked: a receive posted earlier would take a mismatched sender's payload of another size,
and Open MPI's single-copy transfer of a payload larger than its receive corrupts the
receiving process's memory (it does not only raise MPI_ERR_TRUNCATE). Posting it early, on a
tag telling the size, measured no faster at 512 KiB - 16 MiB (``docs/collectives.md``): without
a progress thread the receiver copies a large payload inside its own next MPI call either way.
"""
from __future__ import annotations

from typing import Optional

from ..errors import CollectiveMismatchError
from .base import HEADER_SIZE, Fingerprint, check_header, pack_header, unpack_header

TAG = 0x4E46
CHUNK = 1 << 30  # MPI counts are C ints
PACKED_MAX_BYTES = 8 << 10
SWAP_MAX_BYTES = 256 << 10  # ``mpi_swap`` packs payloads up to this size (``mpi_pair`` sizes)


def swap_max_bytes(world_size: int) -> int:
    """The largest swap at ``world_size`` ranks. Only the two-rank all-reduce (``mpi_pair``)
    swaps more than a packed message, so only there do the buffers kept per peer grow for it."""
    return SWAP_MAX_BYTES if world_size == 2 else PACKED_MAX_BYTES


def first_max_bytes(world_size: int) -> int:
    """The largest first message of the wire at ``world_size`` ranks."""
    return HEADER_SIZE + max(PACKED_MAX_BYTES, swap_max_bytes(world_size))


def chunks(view: memoryview) -> list[memoryview]:
    return [view[i:i + CHUNK] for i in range(0, view.nbytes, CHUNK)]


def post_send(comm, MPI, payload: memoryview, dst: int, fp: Fingerprint,
              header: Optional[bytes] = None, into: Optional[list] = None) -> list:
    """Start sending ``payload`` to ``dst``; the requests keep their buffers alive. ``header``:
    ``pack_header(fp, payload.nbytes)`` when the caller has it already. Each request goes into
    ``into`` (a new list when None, returned) as soon as it is posted: when a later post
    fails, the caller still holds those to cancel."""
    posted = [] if into is None else into
    if header is None:
        header = pack_header(fp, payload.nbytes)
    if payload.nbytes <= PACKED_MAX_BYTES:
        packed = bytearray(header)
        packed += payload
        posted.append(comm.Isend([packed, MPI.BYTE], dst, TAG))
        return posted
    posted.append(comm.Isend([bytearray(header), MPI.BYTE], dst, TAG))
    for c in chunks(payload):
        posted.append(comm.Isend([c, MPI.BYTE], dst, TAG))
    return posted


class FirstBuffers:
    """First-message buffers per peer, each lent to one receive at a time and given back once
    that receive completed: a receive given up (cancelled, perhaps still landing) never gives
    its buffer back, so no later receive shares it."""

    __slots__ = ("_free", "nbytes")

    def __init__(self, nbytes: int) -> None:
        self._free: dict[int, list[bytearray]] = {}
        self.nbytes = nbytes  # of each buffer

    def take(self, peer: int) -> bytearray:
        free = self._free.get(peer)
        return free.pop() if free else bytearray(self.nbytes)

    def give(self, peer: int, buf: bytearray) -> None:
        self._free.setdefault(peer, []).append(buf)


# The stages of an ``Incoming`` message.
POSTING, FIRST, PAYLOAD, DONE = range(4)


class Incoming:
    """One message from ``src`` into ``payload`` on transport ``t``, moved on by ``step`` until
    it is DONE. A sender whose message does not match goes into the transport's table of
    unusable peers: the rest of its stream can no longer be paired. ``header``: the one
    expected, ``pack_header(fp, payload.nbytes)``, when the caller has it already."""

    __slots__ = ("t", "comm", "MPI", "payload", "src", "fp", "stage", "first", "reqs", "header")

    def __init__(self, t, payload: memoryview, src: int, fp: Fingerprint,
                 header: Optional[bytes] = None) -> None:
        self.t, self.comm, self.MPI = t, t.comm, t.mpi
        self.payload, self.src, self.fp, self.header = payload, src, fp, header
        self.stage, self.first, self.reqs = POSTING, None, []

    def post(self) -> None:
        """Post the first receive (``step`` does when it has not been)."""
        self.first = self.t.first_buffers.take(self.src)  # any first message fits
        self.reqs = [self.comm.Irecv([self.first, self.MPI.BYTE], self.src, TAG)]
        self.stage = FIRST

    def step(self) -> int:
        """Move on as far as what has arrived allows; returns the stage reached. Past FIRST,
        this sender's next message may be received (this one's receives are posted)."""
        MPI = self.MPI
        if self.stage == POSTING:
            self.post()
        if self.stage == FIRST:
            status = self.t.status
            if not self.reqs[0].Test(status):
                return FIRST
            first, count = self.first, status.Get_count(MPI.BYTE)  # what arrived: judged next
            nbytes = self.payload.nbytes
            packed = nbytes <= PACKED_MAX_BYTES
            header = self.header
            if header is None:
                header = pack_header(self.fp, nbytes)
            # the common case (the header expected, as long as expected) without a call
            if not (count == HEADER_SIZE + (nbytes if packed else 0)
                    and first.startswith(header)):
                check_first(self.t, first, count, self.src, self.fp, nbytes, packed)
            if packed and count > HEADER_SIZE:
                self.payload[:] = memoryview(first)[HEADER_SIZE:count]
            self.first = None
            self.t.first_buffers.give(self.src, first)  # read: the next receive may use it
            if packed:
                self.reqs, self.stage = [], DONE
                return DONE
            self.reqs = [self.comm.Irecv([c, MPI.BYTE], self.src, TAG)
                         for c in chunks(self.payload)]
            self.stage = PAYLOAD
        if self.stage == PAYLOAD and MPI.Request.Testall(self.reqs):
            self.reqs, self.stage = [], DONE
        return self.stage


def check_first(t, first: bytearray, count: int, src: int, fp: Fingerprint, payload_nbytes: int,
                packed: bool) -> None:
    """CollectiveMismatchError naming both calls unless the first message from ``src`` (``count``
    bytes of ``first``) is the header of the ``payload_nbytes`` message this rank expects, with
    the payload behind it when ``packed``. The slow path: the caller tested the common case
    (``count`` as expected and ``first`` starting with ``pack_header(fp, payload_nbytes)``)
    without a call, and calls this only where that failed; it decodes the header to name the
    sender's call."""
    expected = HEADER_SIZE + (payload_nbytes if packed else 0)
    try:
        got, nbytes = unpack_header(bytes(first[:min(count, HEADER_SIZE)]))
    except ValueError as e:
        t.mark_unusable(src, f"malformed header in {fp.describe()}")
        raise CollectiveMismatchError(
            f"peer rank {src} sent a malformed header ({e}; a {count}-byte message) "
            f"while we expected {fp.describe()}", rank=t.rank, peer=src, op=fp.op,
            seq=fp.seq) from None
    try:
        check_header(fp, got, nbytes, payload_nbytes, rank=t.rank, peer=src)
        if count != expected:
            # The same call in another form (a swap against a plain message: one rank took
            # the two-rank all-reduce, the other the ring), or a message that is not ours.
            forms = {HEADER_SIZE: "a header alone",
                     HEADER_SIZE + nbytes: f"a packed swap of {nbytes} bytes"}
            what = (f"{forms[count]} for {fp.describe()}, where {forms[expected]} was "
                    f"expected" if count in forms else
                    f"a {count}-byte message for {fp.describe()}, whose header says {nbytes} "
                    f"payload bytes")
            raise CollectiveMismatchError(f"peer rank {src} sent {what}", rank=t.rank,
                                          peer=src, op=fp.op, seq=fp.seq)
    except CollectiveMismatchError:
        t.mark_unusable(src, f"mismatched header in {fp.describe()}")
        raise
