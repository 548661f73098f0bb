"""``MpiTransport.send_recv_many``: a batch of messages, every send posted at once and every
receive moved on in one poll over the batch.

One peer's messages are taken in order: the next one's first receive is posted only once the
receives of the one before are (it would otherwise take that payload). Every buffer and peer is
checked before anything is posted, so a bad argument leaves nothing in flight. A batch that
fails (an MPI error at a post or a poll, a timeout, a failed peer) cancels every request it
posted and keeps them, with their buffers, in the transport's ``abandoned``: a cancelled receive
may still land and a cancelled send still read.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from .base import Message
from .mpi_waiting import cancel_all
from .mpi_wire import DONE, PAYLOAD, Incoming, post_send

if TYPE_CHECKING:
    from .mpi import MpiTransport


def run_batch(t: MpiTransport, sends: Sequence[Message], recvs: Sequence[Message],
              byte_view) -> None:
    """The body of ``MpiTransport.send_recv_many`` (called with the transport's lock held)."""
    if not sends and not recvs:
        return
    MPI = t.mpi
    first = (sends or recvs)[0][2]
    outgoing = []
    for buf, dst, fp in sends:
        outgoing.append((byte_view(buf, False, "send"), int(dst), fp))
        t.check_peer(int(dst), fp)
    queues: dict[int, list[Incoming]] = {}
    for buf, src, fp in recvs:
        payload = byte_view(buf, True, "recv")
        t.check_peer(int(src), fp)
        queues.setdefault(int(src), []).append(Incoming(t, payload, int(src), fp))
    incoming = [message for queue in queues.values() for message in queue]
    peers = sorted({dst for _, dst, _ in outgoing} | set(queues))
    sent: list = []  # every send posted, kept for a failure's cancel
    in_flight: list = []  # the sends not yet complete

    def advance():
        pending = [r for r in in_flight if not r.Test()]
        in_flight[:] = pending
        for queue in queues.values():
            i = 0
            while i < len(queue):
                stage = queue[i].step()
                if stage == DONE:
                    del queue[i]
                    continue
                pending += queue[i].reqs
                if stage < PAYLOAD:  # the next is received for once these are posted
                    break
                i += 1
        if pending or any(queues.values()):
            return pending
        return None

    try:
        try:
            for view, dst, fp in outgoing:
                post_send(t.comm, MPI, view, dst, fp, into=sent)
        except MPI.Exception as e:  # the wait converts those of its own polls
            t.raise_mpi_error(sent, first, peers, e)
        in_flight += sent
        t.wait_requests(list(sent), first, peers, advance)
    except BaseException:
        # A wait cancels what it last polled; a receive posted by the poll that failed, and a
        # send whose post failed partway, are cancelled here.
        cancel_all(sent + [req for message in incoming for req in message.reqs])
        t.abandoned += [sent, incoming]
        raise
