"""Counting the bytes a rank's transport sends: what a step really moves, not a formula.

``counting_sent_bytes(group)`` wraps the point-to-point entry points of the group's transport
(``send``, ``sendrecv``, ``send_recv_many``, and the tcp and mpi transports'
``send_recv_chained`` with the messages its follow-ups queue: every collective that runs over
the transport's messages goes through them, the ring, the trees and the two-rank pipelines
included) and adds up the payload bytes this rank sends inside the block, headers left out. Collectives a transport runs its own way
are not messages: shared memory's direct collectives (``shm``) read the peers' copies, and an
MPI or NCCL collective happens inside the library; ``SentBytes.counted`` then stays 0, and a
measurement of the bytes moved runs on ``tcp``.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, Optional

from ..group.world import resolve_group


class SentBytes:
    """``counted``: payload bytes sent so far inside the block; ``messages``: their number."""

    def __init__(self) -> None:
        self.counted = 0
        self.messages = 0

    def add(self, buf: Any) -> None:
        self.counted += int(getattr(buf, "nbytes", 0))
        self.messages += 1


@contextlib.contextmanager
def counting_sent_bytes(group: Optional[Any] = None) -> Iterator[SentBytes]:
    """Count what this rank's transport sends inside the block (see the module docstring).
    Not reentrant for one transport; the count covers every group sharing the transport."""
    transport = resolve_group(group).transport
    tally = SentBytes()
    if transport is None:  # a group of one rank: nothing is sent
        yield tally
        return
    send, sendrecv, many = transport.send, transport.sendrecv, transport.send_recv_many

    def counted_send(buf, dst, fp):
        tally.add(buf)
        return send(buf, dst, fp)

    def counted_sendrecv(sendbuf, dst, recvbuf, src, fp):
        tally.add(sendbuf)
        return sendrecv(sendbuf, dst, recvbuf, src, fp)

    def counted_many(sends, recvs):
        for buf, _, _ in sends:
            tally.add(buf)
        return many(sends, recvs)

    transport.send, transport.sendrecv = counted_send, counted_sendrecv
    transport.send_recv_many = counted_many
    chained = getattr(transport, "send_recv_chained", None)
    if chained is not None:
        transport.send_recv_chained = _counting_chained(chained, tally)
    try:
        yield tally
    finally:  # the class's methods again
        for name in ("send", "sendrecv", "send_recv_many", "send_recv_chained"):
            transport.__dict__.pop(name, None)


def _counting_chained(chained, tally: SentBytes):
    """``send_recv_chained`` counting its sends and those its receives' follow-ups queue."""
    def counted_follow_up(then):
        def follow_up():
            queued = then()
            for buf, _, _ in queued:
                tally.add(buf)
            return queued
        return follow_up

    def counted_chained(sends, recvs):
        for buf, _, _ in sends:
            tally.add(buf)
        return chained(sends, [(buf, src, fp, then if then is None else counted_follow_up(then))
                               for buf, src, fp, then in recvs])
    return counted_chained
