"""How the MPI transport waits: every wait polls non-blocking requests, bounded by the
transport's timeout, and looks about twice a second for a dead peer on this host (pid and start
time), a peer's notice that it left or saw a failure, and the heartbeat's verdicts. A wait that
gives up cancels its requests and marks the peers it needed unusable.

Polling never sleeps for the first ``SPIN_S`` of a wait: MPI moves a message only while a call
of this process drives it, and the shortest sleep lasts tens of microseconds (the kernel's timer
slack), several times a whole small message. Past ``YIELD_AFTER_S`` (about what a 1 MiB piece
takes) each poll yields the core (``sched_yield``: at once back when nothing else wants it): a
rank that held its core while other processes wait for one would leave them all to the core its
peer needs, which then waits for them (milliseconds on a busy machine); yielding sooner would
hand the core away in the middle of most transfers. Past ``SPIN_S`` the wait naps, in naps
growing to ``NAP_MAX_S``, so that a long wait does not burn a core. A wait over many requests
that still sees some complete (a pipeline of pieces) is not a long wait: each completion starts
the spin window again, since a nap there would stall every piece behind it.

``RequestWaiting`` is the part of ``MpiTransport`` (``mpi.py``) that does this; it uses the
transport's communicator, notices, peer table and timeout.
"""
from __future__ import annotations

import os
import time
from typing import NoReturn

from ..errors import CollectiveTimeoutError, DistributedError, PeerFailureError
from ..health import heartbeat
from ..processes import process_alive
from .base import Fingerprint
from .mpi_exit import mark_broken
from .mpi_notices import FAILED, LEFT

LIVENESS_PERIOD_S = 0.5
YIELD_AFTER_S, SPIN_S = 2e-4, 2e-3
_NAP_MIN_S, NAP_MAX_S = 2e-5, 5e-4
_FAILED_LOOKS = 5  # over one liveness period, for news of a failure to arrive


class RequestWaiting:
    """The waiting half of ``MpiTransport``."""

    def _wait(self, reqs: list, peers: list[int], fp: Fingerprint, advance=None) -> None:
        """Poll ``reqs`` to completion; raise on timeout, a dead same-host peer (any rank of
        the job: a subgroup's waits fail too when a rank outside it died) or a failure the
        heartbeat found. With ``advance``, each poll calls it instead: it tests the requests
        itself, posts what their completion allows, and returns those still pending, or None
        once everything is done."""
        MPI = self._mpi
        if advance is None:
            testall = MPI.Request.Testall

            def advance():
                return None if testall(reqs) else reqs
        clock = time.monotonic
        start = clock()
        deadline, nap = start + self.timeout, 0.0
        yield_from, spin_until = start + YIELD_AFTER_S, start + SPIN_S
        try:
            self._look(reqs, peers, fp, start, start, advance)  # even when done at once
        except MPI.Exception as e:  # a notice's probe, or the poll of a peer that left
            self._mpi_error(reqs, peers, fp, e)
        while True:
            try:
                pending = advance()
                if pending is None:
                    return
                now = clock()
                if len(pending) != len(reqs):  # progress: a pipeline is moving, keep up
                    spin_until, nap = now + SPIN_S, 0.0
                reqs = pending
                if now >= self._next_check:
                    self._look(reqs, peers, fp, start, now, advance)
            except MPI.Exception as e:
                self._mpi_error(reqs, peers, fp, e)
            if now > deadline:
                self._give_up(reqs, peers, f"timeout in {fp.describe()}")
                raise CollectiveTimeoutError(
                    f"{fp.describe()} did not complete within {self.timeout} s"
                    + (f" (waiting on rank(s) {peers})" if peers else ""), rank=self.rank,
                    peer=peers[0] if len(peers) == 1 else None, op=fp.op, seq=fp.seq)
            if now < spin_until:
                if now > yield_from:
                    os.sched_yield()
            else:
                nap = min(NAP_MAX_S, 2 * nap or _NAP_MIN_S)
                time.sleep(nap)

    def look_due(self) -> bool:
        """Whether the next liveness look (``_look``) is due: a wait that completes at its first
        poll may skip setting up a wait only while it is not."""
        return time.monotonic() >= self._next_check

    def _mpi_error(self, reqs: list, peers: list[int], fp: Fingerprint,
                   e: Exception) -> NoReturn:
        """Raise for an error MPI reported in a wait: PeerFailureError naming the failed rank
        when MPI knows one (fault tolerance on), DistributedError otherwise."""
        failed = self._failed_ranks()
        self._give_up(reqs, peers + failed, f"MPI error in {fp.describe()}",
                      peer_failed=bool(failed))
        if failed:
            raise PeerFailureError(f"MPI reports rank(s) {failed} failed during "
                                   f"{fp.describe()} ({e})", rank=self.rank,
                                   peer=failed[0], op=fp.op, seq=fp.seq) from None
        raise DistributedError(f"MPI reported: {e}", rank=self.rank,
                               peer=peers[0] if peers else None, op=fp.op,
                               seq=fp.seq) from None

    def _look(self, reqs: list, peers: list[int], fp: Fingerprint, start: float,
              now: float, advance) -> None:
        """Every ~``LIVENESS_PERIOD_S`` of this rank's waiting: the pids, the peers' notices,
        then the heartbeat."""
        if now >= self._next_check:
            self._next_check = now + LIVENESS_PERIOD_S
            self._check_liveness(reqs, peers, fp)
            gone = self._read_notices(peers, now - start, advance)
            try:  # first: a peer that left may have left because of a failure the heartbeat knows
                heartbeat.check(self.rank, fp.op, fp.seq)
            except PeerFailureError as e:
                self._give_up(reqs, [] if e.peer is None else [e.peer], str(e), peer_failed=True)
                raise
            if gone:
                why = f"peer rank {gone[0]} left the job (it closed its transport)"
                self._give_up(reqs, gone, why, peer_failed=True)
                raise PeerFailureError(f"{why} while this rank was waiting for it in "
                                       f"{fp.describe()}", rank=self.rank, peer=gone[0],
                                       op=fp.op, seq=fp.seq)

    def _check_liveness(self, reqs: list, peers: list[int], fp: Fingerprint) -> None:
        dead = [peer for peer, (pid, start) in self._local_peers.items()
                if not process_alive(pid, start)]
        if dead:
            # Name the peer we wait on first: others may be exiting because of that death.
            dead.sort(key=lambda peer: (peer not in peers, peer))
            self._give_up(reqs, peers + dead, f"peer rank(s) {dead} died", peer_failed=True)
            raise PeerFailureError(f"peer rank(s) {dead} on this host (pids "
                                   f"{[self._local_peers[d][0] for d in dead]}) died during "
                                   f"{fp.describe()}", rank=self.rank, peer=dead[0],
                                   op=fp.op, seq=fp.seq)

    def _read_notices(self, peers: list[int], waited: float, advance) -> list[int]:
        """Take in the peers' notices; return the peers this wait needs that have left.

        A failure a peer found goes to the heartbeat's list, which the caller checks next. A
        peer that left fails the wait only once this rank has waited ``LIVENESS_PERIOD_S``
        for it and the requests still do not complete (``advance`` polls once more): a peer
        that sent its last message and then closed is read, not blamed. Peers this wait does not
        need may leave: they may have no more work in the subgroups still running. ``peers``
        empty: every rank takes part."""
        needed = set(peers) if peers else set(range(self.world_size)) - {self.rank}
        gone = sorted(needed & self.take_in_notices())
        if gone and waited >= LIVENESS_PERIOD_S and advance() is not None:
            return gone
        return []

    def take_in_notices(self) -> set:
        """Read the notices that have arrived; return the peers known to have left. A failure
        a peer found goes to the heartbeat's list."""
        for sender, kind, about, reason in self._notices.poll():
            if kind == LEFT:
                self._left.add(sender)
            elif kind == FAILED and about != self.rank:
                heartbeat.record_failure(about, reason)  # it says who saw it
        return self._left

    def local_peer_died(self) -> bool:
        """Whether a peer on this host died (its pid is gone, or reused)."""
        return any(not process_alive(pid, start) for pid, start in self._local_peers.values())

    def publish_failure(self, peer: int, reason: str) -> None:
        """Tell every other rank that ``peer`` failed (the heartbeat's ``publish`` without a
        store): their waits then name that peer, not this rank, which leaves because of it."""
        with self._lock:
            if self._comm is not None:
                self._notices.send(FAILED, peer, reason)

    def _failed_ranks(self) -> list[int]:
        """Ranks that MPI knows to have failed: with fault tolerance on (Open MPI's
        ``mpiexec --with-ft ulfm``) a death makes requests fail instead of aborting the job.
        The news may reach this rank a moment after the failed request, so look a few times."""
        MPI, comm = self._mpi, self._comm
        for _ in range(_FAILED_LOOKS):
            try:
                group = comm.Get_failed()
            except (AttributeError, NotImplementedError, MPI.Exception):
                return []  # an MPI without ULFM
            try:
                size = group.Get_size()
                if size:
                    mine = comm.Get_group()
                    try:
                        return sorted(MPI.Group.Translate_ranks(group, list(range(size)), mine))
                    finally:
                        mine.Free()
            finally:
                group.Free()
            time.sleep(LIVENESS_PERIOD_S / _FAILED_LOOKS)
        return []

    def _give_up(self, reqs: list, peers: list[int], why: str, peer_failed: bool = False) -> None:
        cancel_all(reqs)
        for peer in peers:
            self._unusable.setdefault(peer, why)
        if peer_failed:  # MPI_Finalize would wait for it (see ``at_process_exit``)
            mark_broken(why)


def cancel_all(reqs) -> None:
    """Cancel every request of ``reqs`` that may still be in flight."""
    for req in reqs:
        try:
            req.Cancel()
        except Exception:  # already complete, or an MPI that cannot cancel sends
            pass
