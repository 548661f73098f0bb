"""How the MPI transport puts a message on the wire, and how it takes one off.

Every message starts with the fixed-size header of ``base`` (the fingerprint and the payload
length). A payload of at most ``PACKED_MAX_BYTES`` travels in the same MPI message as its
header, copied behind it: one message costs one MPI send and one receive, where copying a few
KiB costs less than a second message. A larger payload follows its header as messages of its
own, sent and received in place, without a copy. MPI keeps the messages of one sender on one
tag in order, so a header and its payload stay paired.

A receive posts its first MPI receive at once, before the message arrives, into a buffer of
``FIRST_MAX_BYTES``: every first message of this wire fits (a header alone, or a header and a
packed payload), whatever size the sender chose, so no probe is needed to learn it. A message of
another size than the one expected is still received whole and its header names the sender's
call, so mismatched calls raise ``CollectiveMismatchError`` naming both, never an MPI truncation
error or a wait for a payload that will not come. A payload is received only once its header
was checked.
"""
from __future__ import annotations

from typing import Optional

from ..errors import CollectiveMismatchError
from .base import HEADER_SIZE, Fingerprint, check_header, pack_header, unpack_header

TAG = 0x4E46
CHUNK = 1 << 30  # MPI counts are C ints
PACKED_MAX_BYTES = 8 << 10
FIRST_MAX_BYTES = HEADER_SIZE + PACKED_MAX_BYTES  # the largest first message of this wire


def chunks(view: memoryview) -> list[memoryview]:
    return [view[i:i + CHUNK] for i in range(0, view.nbytes, CHUNK)]


def post_send(comm, MPI, payload: memoryview, dst: int, fp: Fingerprint,
              header: Optional[bytes] = None) -> list:
    """Start sending ``payload`` to ``dst``; the requests keep their buffers alive. ``header``:
    ``pack_header(fp, payload.nbytes)`` when the caller has it already."""
    if header is None:
        header = pack_header(fp, payload.nbytes)
    if payload.nbytes <= PACKED_MAX_BYTES:
        packed = bytearray(header)
        packed += payload
        return [comm.Isend([packed, MPI.BYTE], dst, TAG)]
    return [comm.Isend([bytearray(header), MPI.BYTE], dst, TAG)] + \
        [comm.Isend([c, MPI.BYTE], dst, TAG) for c in chunks(payload)]


# The stages of an ``Incoming`` message.
POSTING, FIRST, PAYLOAD, DONE = range(4)


class Incoming:
    """One message from ``src`` into ``payload`` on transport ``t``, moved on by ``step`` until
    it is DONE. A sender whose message does not match goes into the transport's table of
    unusable peers: the rest of its stream can no longer be paired. ``header``: the one
    expected, ``pack_header(fp, payload.nbytes)``, when the caller has it already."""

    __slots__ = ("t", "comm", "MPI", "payload", "src", "fp", "stage", "first", "reqs", "status",
                 "header")

    def __init__(self, t, payload: memoryview, src: int, fp: Fingerprint,
                 header: Optional[bytes] = None) -> None:
        self.t, self.comm, self.MPI = t, t.comm, t.mpi
        self.payload, self.src, self.fp, self.header = payload, src, fp, header
        self.stage, self.first, self.reqs, self.status = POSTING, None, [], None

    def step(self) -> int:
        """Move on as far as what has arrived allows; returns the stage reached. Past FIRST,
        this sender's next message may be received (this one's receives are posted)."""
        MPI = self.MPI
        if self.stage == POSTING:
            self.first = bytearray(FIRST_MAX_BYTES)  # any first message fits: judged after
            self.reqs = [self.comm.Irecv([self.first, MPI.BYTE], self.src, TAG)]
            self.status = MPI.Status()
            self.stage = FIRST
        if self.stage == FIRST:
            if not self.reqs[0].Test(self.status):
                return FIRST
            del self.first[self.status.Get_count(MPI.BYTE):]  # what arrived: judged next
            self._check_first()
            if self.payload.nbytes <= PACKED_MAX_BYTES:
                if self.payload.nbytes:
                    self.payload[:] = memoryview(self.first)[HEADER_SIZE:]
                self.reqs, self.stage = [], DONE
                return DONE
            self.reqs = [self.comm.Irecv([c, MPI.BYTE], self.src, TAG)
                         for c in chunks(self.payload)]
            self.stage = PAYLOAD
        if self.stage == PAYLOAD and MPI.Request.Testall(self.reqs):
            self.reqs, self.stage = [], DONE
        return self.stage

    def _check_first(self) -> None:
        """CollectiveMismatchError naming both calls unless the first message is the header
        (and, for a small payload, the payload) of the message this rank expects."""
        first, fp, src, t = self.first, self.fp, self.src, self.t
        packed = self.payload.nbytes <= PACKED_MAX_BYTES
        expected = HEADER_SIZE + (self.payload.nbytes if packed else 0)
        header = self.header or pack_header(fp, self.payload.nbytes)
        if len(first) == expected and first.startswith(header):
            return  # the common case, without decoding the header
        header = bytes(first[:HEADER_SIZE])
        try:
            got, nbytes = unpack_header(header)
        except ValueError as e:
            t.mark_unusable(src, f"malformed header in {fp.describe()}")
            raise CollectiveMismatchError(
                f"peer rank {src} sent a malformed header ({e}; a {len(first)}-byte message) "
                f"while we expected {fp.describe()}", rank=t.rank, peer=src, op=fp.op,
                seq=fp.seq) from None
        try:
            check_header(fp, got, nbytes, self.payload.nbytes, rank=t.rank, peer=src)
            if len(first) != HEADER_SIZE + (nbytes if packed else 0):
                raise CollectiveMismatchError(
                    f"peer rank {src} sent a {len(first)}-byte message for {fp.describe()}, "
                    f"whose header says {nbytes} payload bytes", rank=t.rank, peer=src,
                    op=fp.op, seq=fp.seq)
        except CollectiveMismatchError:
            t.mark_unusable(src, f"mismatched header in {fp.describe()}")
            raise
