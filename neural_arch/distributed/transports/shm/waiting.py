"""Waiting on counters in shared memory: spin briefly, then back off, bounded and watchful.

A waiter first polls a counter up to a few thousand times (a peer running on another core
usually answers within microseconds), then yields the CPU for a couple of milliseconds, then
sleeps in growing steps up to about 1 ms, so that more ranks than cores still make progress.
Barrier counters, whose writers wake their sleepers, are waited on differently after the
polling: the waiter yields for only 0.1 ms, then sleeps in the kernel on the counter's word (a
futex, ``sleep_until_ge``), which leaves the core to a rank that has work until the last one
arrives.
The polling budget adapts: it halves whenever polling alone was not enough (the peer was not
running, as when ranks outnumber free cores) and doubles when it was. Every wait is bounded by
the transport's timeout, and every ~100 ms of this rank's waiting, however it is cut into
waits, it checks that the peers it waits on are still alive and have not closed their end, that
no other rank of the job died, and what the heartbeat found, so a killed rank is reported
within a fraction of a second.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Optional, Sequence

from ...health import heartbeat
from . import futex
from ...errors import CollectiveTimeoutError, PeerFailureError

SPIN_POLLS = 2000
MIN_SPIN_POLLS = 16
YIELD_PHASE_S = 2e-3
LIVENESS_PERIOD_S = 0.1
FIRST_SLEEP_S = 2e-5
MAX_SLEEP_S = 1e-3
FUTEX_SLICE_S = 5e-3
YIELD_BEFORE_SLEEP_S = 1e-4

_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (a killed child stays one until reaped)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return False
    except OSError:
        stat = b""
    if stat:
        # The command name may contain spaces and parentheses; the state follows the last ')'.
        state = stat[stat.rfind(b")") + 2:stat.rfind(b")") + 3]
        return state not in (b"Z", b"X", b"x")
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PeerWatch:
    """What a rank knows about the job's ranks: their pids and whether they closed their transport.

    ``closed(peer)`` reads the peer's flag in shared memory. Liveness by pid is only used for
    peers whose pid was visible when the job started (ranks in other pid namespaces are not),
    so a live peer is never reported dead.

    A job is one failure domain: a wait fails when any rank of the job died, not only one it
    waits on, so ranks looping in a subgroup stop too when a rank outside it dies (as on tcp,
    where every peer's socket is watched). A rank outside the wait that closed its transport
    before exiting left the job cleanly (it may have no more work in the subgroups still
    running) and fails nothing. The looks are spaced by ``next_check``, shared by every wait
    of this rank: a run of short waits is watched as closely as one long wait.
    """

    def __init__(self, rank: int, pids: Sequence[int], closed: Callable[[int], bool]) -> None:
        self.rank = rank
        self.closed = closed
        self.spin_polls = SPIN_POLLS  # this rank's adaptive polling budget (see wait_ge)
        self.next_check = 0.0  # time.monotonic() of the next look (see ``look``)
        self.know(pids)

    def know(self, pids: Sequence[int]) -> None:
        """Watch the peers' processes from now on (0: a pid not known, not watched)."""
        self.pids = list(pids)
        self.watch_pid = [peer != self.rank and pid > 0 and pid_alive(pid)
                          for peer, pid in enumerate(self.pids)]

    def look(self, peers: Sequence[int], op: str, seq: Optional[int],
             since: Optional[float] = None) -> float:
        """``check`` when ~LIVENESS_PERIOD_S have passed since the last look; returns the time.
        Cheap enough for every wait, even one that ends at once.

        ``peers`` fail the look by closing their end only once this rank has waited
        LIVENESS_PERIOD_S for them since ``since`` (None: not waiting yet); until then they are
        watched like any other rank, so a peer that sent its last message and then closed is
        read a moment later rather than failed at once.
        """
        now = time.monotonic()
        if now >= self.next_check:
            self.next_check = now + LIVENESS_PERIOD_S
            owed = since is not None and now - since >= LIVENESS_PERIOD_S
            self.check(peers, op, seq, waiting=owed)
        return now

    def check(self, peers: Sequence[int], op: str, seq: Optional[int],
              waiting: bool = True) -> None:
        """Raise PeerFailureError naming the first of ``peers`` that died, closed or hung, or
        else any other rank of the job that died without closing its transport.

        ``waiting=False``: ``peers`` are watched like the other ranks (see ``look``).
        """
        heartbeat.check(self.rank, op, seq)  # a hung (stopped) peer has a live pid
        if waiting:
            for peer in peers:
                if self.closed(peer):
                    raise PeerFailureError(
                        f"peer rank {peer} closed its shared-memory transport while this rank "
                        "was still waiting for it", rank=self.rank, peer=peer, op=op, seq=seq)
                if self.watch_pid[peer] and not pid_alive(self.pids[peer]):
                    raise PeerFailureError(
                        f"peer rank {peer} (pid {self.pids[peer]}) died while this rank was "
                        "waiting for it", rank=self.rank, peer=peer, op=op, seq=seq)
        for other, watched in enumerate(self.watch_pid):
            if not watched or (waiting and other in peers) or pid_alive(self.pids[other]):
                continue
            if self.closed(other):  # read after its death: it closed first, so it left cleanly
                self.watch_pid[other] = False
                continue
            waited = ", ".join(str(p) for p in sorted(set(peers))) or "none"
            raise PeerFailureError(
                f"{'peer ' if other in peers else ''}rank {other} (pid {self.pids[other]}) died "
                "without closing its shared-memory transport" + (
                    "" if other in peers else " (a failure anywhere in the job fails every "
                    f"wait; this one was for rank(s) {waited})"),
                rank=self.rank, peer=other, op=op, seq=seq)


class Backoff:
    """One blocking wait. Call ``pause(peers)`` after each poll that found nothing new.

    Raises CollectiveTimeoutError once ``timeout`` seconds pass without the caller making
    progress (create a new Backoff after progress), and PeerFailureError when one of the
    peers still being waited on has died or closed. ``arrived()``, when given, tells whether
    what the caller waits for has happened since it last looked: a peer may store it and then
    close or exit at once (after raising a mismatch it saw there, say), and its last store
    counts, so neither error is raised then.
    """

    __slots__ = ("watch", "op", "seq", "what", "start", "deadline", "yield_until", "delay",
                 "timeout", "arrived")

    def __init__(self, watch: PeerWatch, timeout: float, op: str, seq: Optional[int],
                 what: str, arrived: Optional[Callable[[], bool]] = None) -> None:
        self.watch, self.op, self.seq, self.what = watch, op, seq, what
        self.timeout, self.arrived = timeout, arrived
        self.start = time.monotonic()
        self.deadline = self.start + timeout
        self.yield_until = self.start + YIELD_PHASE_S
        self.delay = FIRST_SLEEP_S

    def check(self, peers: Sequence[int]) -> float:
        """Raise if the wait is over time or a peer failed; return the current time."""
        try:
            now = self.watch.look(peers, self.op, self.seq, self.start)
            if now >= self.deadline:
                peer = peers[0] if peers else None
                raise CollectiveTimeoutError(
                    f"timed out after {now - self.start:.1f} s (timeout {self.timeout} s) "
                    f"waiting for {self.what}"
                    + (f" from peer rank {peer}" if peer is not None else ""),
                    rank=self.watch.rank, peer=peer, op=self.op, seq=self.seq)
        except (PeerFailureError, CollectiveTimeoutError):
            if self.arrived is not None and self.arrived():
                return time.monotonic()
            raise
        return now

    def pause(self, peers: Sequence[int]) -> None:
        """Check, then, unless what the wait waits for has come meanwhile, give the core away
        for a while: yield at first, then sleep for doubling spells (the caller polls again
        after)."""
        now = self.check(peers)
        if self.arrived is not None and self.arrived():
            return  # it came while the peers were being looked at: no nap
        if now < self.yield_until:
            _yield()
            return
        time.sleep(self.delay)
        self.delay = min(self.delay * 2, MAX_SLEEP_S)


def spin_until_ge(counters, index: int, target: int, watch: PeerWatch) -> bool:
    """Poll ``counters[index] >= target`` within the adaptive budget; True once it holds."""
    budget = watch.spin_polls
    for _ in range(budget):
        if counters[index] >= target:
            if budget < SPIN_POLLS:
                watch.spin_polls = budget * 2
            return True
    watch.spin_polls = max(MIN_SPIN_POLLS, budget // 2)
    return False


def wait_ge(counters, index: int, target: int, peer: int, watch: PeerWatch, timeout: float,
            op: str, seq: Optional[int], what: str) -> None:
    """Block until ``counters[index] >= target``; the counter is written by ``peer``."""
    if counters[index] >= target or spin_until_ge(counters, index, target, watch):
        return
    def arrived() -> bool:
        return counters[index] >= target
    backoff = Backoff(watch, timeout, op, seq, what, arrived)
    peers = (peer,)
    while not arrived():
        backoff.pause(peers)


def sleep_until_ge(counters, index: int, target: int, peer: int, watch: PeerWatch,
                   timeout: float, op: str, seq: Optional[int], what: str, flag: int,
                   base_address: int) -> None:
    """``wait_ge`` for a counter whose writer calls ``wake_sleepers``: after spinning and a
    short spell of yielding in vain, sleep in the kernel on the counter's word (``counters``
    start at ``base_address``).

    A rank that keeps yielding or napping is still scheduled on a core whose other rank has
    work to do (4 ranks on 2 cores ran a 16 MiB all-reduce at half speed or less in about a
    third of the jobs); one asleep in the kernel leaves that core to it until woken. Yielding
    first keeps small collectives quick, where the wait is shorter than a sleep and a wake. ``counters[flag]``
    tells the writer which word this rank sleeps on. The kernel only sleeps while the word
    still holds the value read here, so a store made before the call is never slept through;
    each sleep is also bounded by FUTEX_SLICE_S, which limits what a wake-up lost to store
    reordering could cost and keeps the liveness checks running. Without a futex this is
    ``wait_ge``.
    """
    if not futex.AVAILABLE:
        wait_ge(counters, index, target, peer, watch, timeout, op, seq, what)
        return
    if counters[index] >= target or spin_until_ge(counters, index, target, watch):
        return
    def arrived() -> bool:
        return counters[index] >= target
    backoff = Backoff(watch, timeout, op, seq, what, arrived)
    peers, address = (peer,), base_address + 8 * index
    yield_until = backoff.start + YIELD_BEFORE_SLEEP_S
    while not arrived():
        if backoff.check(peers) >= yield_until:
            break
        _yield()
    else:
        return
    counters[flag] = index + 1
    try:
        while True:
            value = counters[index]
            if value >= target:
                return
            now = backoff.check(peers)
            futex.wait(address, value, min(FUTEX_SLICE_S, watch.next_check - now))
    finally:
        counters[flag] = 0


def wake_sleepers(counters, index: int, flags: Sequence[int], base_address: int) -> None:
    """After storing ``counters[index]``: wake the ranks whose ``flags`` word says they sleep
    on it (one system call wakes them all)."""
    if not futex.AVAILABLE:
        return
    mark = index + 1
    for flag in flags:
        if counters[flag] == mark:
            futex.wake(base_address + 8 * index)
            return


