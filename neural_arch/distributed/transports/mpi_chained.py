"""``MpiTransport.send_recv_chained``: a batch whose receives may each carry a follow-up, moved
in one poll, so that a received piece is worked on (and its result sent on) while later pieces
are still in flight (``mpi_pair``).

On the wire a chained call first sends each peer one *plan*: an ordinary message of ``mpi_wire``
(its header checked as every message's is) whose header holds the call's fingerprint and whose
payload is ``PLAN_MARK``. The payloads follow on their own tag (``CHAIN_TAG``) without headers:
both sides cut the same pieces from the same fingerprint, so every size is known before it
arrives, and a receive is posted into its buffer at once, with no probe and no copy. A peer
that runs another collective (another operation, size, dtype or sequence number) is caught by
its plan, before any payload of this call is received: ``CollectiveMismatchError`` naming both
calls. A payload of another size than the one expected (which a matching plan rules out) still
raises, never truncates in silence.

A receive is posted only once the peer's plan matched, every earlier receive from that peer is
posted (MPI pairs one sender's messages on one tag in order), and its buffer overlaps neither a
send still in flight (MPI forbids writing what a pending send reads) nor an earlier receive whose
follow-up has not run yet: that is how a caller reuses a few receive slots for many pieces.

Every buffer given to the call is checked before anything is posted, so a bad one leaves
nothing in flight. A follow-up's messages exist only once its receive completed, after the
plans went out: a failure there (a bad buffer, an error of the follow-up) marks every peer of
the call unusable, since each may wait for pieces that never come (until its own timeout).
"""
from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING, Sequence

from ..errors import CollectiveMismatchError
from .base import Fingerprint, Message
from .mpi_waiting import cancel_all
from .mpi_wire import DONE, TAG, Incoming, post_send

if TYPE_CHECKING:
    from .mpi import MpiTransport
    from .tcp_messages import ChainedRecv

# A tag of its own, beside the wire's (``mpi_wire.TAG``) and the notices' (``mpi_notices.TAG``):
# a notice poll that found a payload would swallow it.
CHAIN_TAG = 0x4E48
PLAN_MARK = b"NFchain1"


def _address_of(MPI):
    """``address(view)``: where a byte view's memory starts (mpi4py's buffer object reads it
    in a tenth of the time NumPy's array interface takes)."""
    buffer = getattr(MPI, "buffer", None) or MPI.memory
    return lambda view: buffer.frombuffer(view, readonly=True).address


class _Receive:
    __slots__ = ("view", "fp", "then", "lo", "hi", "req")

    def __init__(self, view: memoryview, fp: Fingerprint, then, lo: int) -> None:
        self.view, self.fp, self.then = view, fp, then
        self.lo, self.hi = lo, lo + view.nbytes
        self.req = None


def run_chained(t: MpiTransport, sends: Sequence[Message], recvs: Sequence[ChainedRecv],
                byte_view) -> None:
    """The body of ``MpiTransport.send_recv_chained`` (called with the transport's lock held)."""
    if not sends and not recvs:
        return
    MPI, comm = t.mpi, t.comm
    address = _address_of(MPI)
    first = (sends or recvs)[0][2]
    peers = sorted({int(m[1]) for m in sends} | {int(m[1]) for m in recvs})
    for peer in peers:
        t.check_peer(peer, first)
    plans = {}  # peer -> its plan, until matched
    send_reqs: list = []  # every send not yet complete, and beside it the bytes it reads
    send_spans: list = []
    every_send: list = []  # kept for a failure's cancel
    waiting: dict[int, deque] = {peer: deque() for peer in peers}  # not yet posted
    posted: dict[int, deque] = {peer: deque() for peer in peers}  # follow-up not yet run
    for buf, src, fp, then in recvs:
        view = byte_view(buf, True, "recv")
        waiting[int(src)].append(_Receive(view, fp, then, address(view)))
    # Every buffer is checked before anything is posted: a bad one found after a peer got its
    # plan would leave that peer waiting for pieces that never come.
    outgoing = [(byte_view(buf, False, "send"), int(dst)) for buf, dst, _ in sends]

    def send(view: memoryview, dst: int) -> None:
        if view.nbytes:
            lo = address(view)
            req = comm.Isend([view, MPI.BYTE], int(dst), CHAIN_TAG)
            send_reqs.append(req)
            send_spans.append((lo, lo + view.nbytes))
            every_send.append(req)

    def post_plans_and_sends() -> None:
        for peer in peers:
            plans[peer] = Incoming(t, memoryview(bytearray(len(PLAN_MARK))), peer, first)
            already = len(every_send)
            post_send(comm, MPI, memoryview(PLAN_MARK), peer, first, into=every_send)
            for req in every_send[already:]:
                send_reqs.append(req)
                send_spans.append((0, 0))
        for view, dst in outgoing:
            send(view, dst)

    def follow_up(r: _Receive) -> None:
        """Send what ``r.then()`` returns. Its buffers exist only now, after the plans went
        out, so a failure here (a bad buffer, an error of the follow-up itself) cannot be
        caught before the peers wait for this call's pieces: each is marked unusable, so that
        later calls raise at once, naming why, instead of pairing its stream out of step."""
        try:
            for buf, dst, _ in r.then():
                send(byte_view(buf, False, "send"), int(dst))
        except MPI.Exception:
            raise  # the wait converts it, marking the peers unusable
        except Exception as e:
            for peer in peers:
                t.mark_unusable(peer, f"a follow-up of {r.fp.describe()} failed after the "
                                      f"plans were sent ({type(e).__name__}: {e})")
            raise

    status, testsome = MPI.Status(), MPI.Request.Testsome
    live: list = []  # what a wait that gives up cancels

    def postable(r: _Receive) -> bool:
        for lo, hi in send_spans:
            if r.lo < hi and lo < r.hi:
                return False
        for queue in posted.values():
            for other in queue:
                if r.lo < other.hi and other.lo < r.hi:
                    return False
        return True

    def advance():
        nonlocal live
        changed = False
        for peer, plan in list(plans.items()):
            stage = plan.stage
            if plan.step() == DONE:
                _check_plan(t, plans.pop(peer))
            if plan.stage != stage:  # a receive posted or finished: the waited set changes
                changed = True
        if send_reqs:
            finished = testsome(send_reqs)  # one pass of MPI's progress for all of them
            if finished is None:  # every one complete already
                finished = range(len(send_reqs))
            if finished:
                for i in sorted(finished, reverse=True):
                    del send_reqs[i], send_spans[i]
                changed = True
        for peer in peers:
            if peer in plans:
                continue
            done, later = posted[peer], waiting[peer]
            while done and (done[0].req is None or done[0].req.Test(status)):
                r = done.popleft()
                if r.req is not None:
                    _check_count(t, r, peer, status.Get_count(MPI.BYTE))
                if r.then is not None:
                    follow_up(r)
                changed = True
            while later and postable(later[0]):
                r = later.popleft()
                if r.view.nbytes:
                    r.req = comm.Irecv([r.view, MPI.BYTE], peer, CHAIN_TAG)
                done.append(r)
                changed = True
        if changed:
            live = list(send_reqs)
            for peer in peers:
                plan = plans.get(peer)
                if plan is not None:
                    live += plan.reqs
                live += [r.req for r in posted[peer] if r.req is not None]
            if not live and not plans and not any(posted.values()) \
                    and not any(waiting.values()):
                return None
        return live

    try:
        try:
            post_plans_and_sends()
        except MPI.Exception as e:  # the wait converts those of its own polls
            t.raise_mpi_error(every_send, first, peers, e)
        live = list(send_reqs)
        t.wait_requests(list(live), first, peers, advance)
    except BaseException:
        # What was sent will never be received, and nothing may land in the caller's buffers
        # once this call has returned; a cancelled request may still touch its buffers, so
        # they live on in the transport's ``abandoned``.
        receives = [r.req for queue in posted.values() for r in queue if r.req] \
            + [req for plan in plans.values() for req in plan.reqs]
        cancel_all(every_send + receives)
        t.abandoned += [every_send, receives, plans]
        raise


def _check_plan(t: MpiTransport, plan: Incoming) -> None:
    if bytes(plan.payload) != PLAN_MARK:
        t.mark_unusable(plan.src, f"unpaired message in {plan.fp.describe()}")
        raise CollectiveMismatchError(
            f"peer rank {plan.src} sent a plain {len(PLAN_MARK)}-byte message for "
            f"{plan.fp.describe()} where this rank runs it as a pipeline: ranks called "
            "different collectives or algorithms", rank=t.rank, peer=plan.src, op=plan.fp.op,
            seq=plan.fp.seq)


def _check_count(t: MpiTransport, r: _Receive, peer: int, count: int) -> None:
    if count != r.view.nbytes:
        t.mark_unusable(peer, f"a piece of the wrong size in {r.fp.describe()}")
        raise CollectiveMismatchError(
            f"expected a {r.view.nbytes}-byte piece of {r.fp.describe()} but peer rank {peer} "
            f"sent {count} bytes", rank=t.rank, peer=peer, op=r.fp.op, seq=r.fp.seq)
