"""The heartbeat monitor of a job with a rendezvous store: counters and failure lists in the
store (the protocol is described in ``heartbeat``'s module docstring).
"""
from __future__ import annotations

import json
import time
from collections import deque
from typing import Optional

from ..errors import CollectiveTimeoutError, DistributedError
from . import heartbeat
from .heartbeat import KEY_PREFIX, LEFT_MARK, HeartbeatConfig
from .monitor_thread import MonitorThread

_NOTICE_S = 0.3  # a verdict recorded here reaches a transport's wait loop within this long
_MIN_REQUEST_S = 0.1  # the shortest bound put on one store request (see ``_bound``)


class StoreMonitor(MonitorThread):
    """Counters and failure lists in the rendezvous store (see ``heartbeat``'s docstring)."""

    mode = "store"

    def __init__(self, rank: int, world_size: int, address: tuple,
                 config: HeartbeatConfig) -> None:
        super().__init__(rank, config)
        self.world_size, self._address, self._store = world_size, address, None
        self._left: set = set()  # peers known to have left cleanly
        self._read = 0  # the newest failure list read or written here
        self._own: list = []  # failure lists published here
        self._heard: list = []  # failure lists published elsewhere and read here
        self._outbox: deque = deque()  # (rank, reason) found here, to be published
        self._unwritten: dict = {}  # failure list number -> when it was first seen missing
        self._rank0_leaving = False
        self._abandoned = False  # this rank declares itself failed as it leaves (``abandon``)
        self.linger_s = 2 * config.interval + 0.5
        # Rank 0's requests (to the store it serves itself) fail after this long; the other
        # ranks' requests are bounded by what is left of ``timeout`` (``_bound``).
        self._request_timeout = max(config.timeout - config.interval, config.interval)
        self._connected = False  # whether this rank's heartbeat connection ever completed

    def publish(self, rank: int, reason: str) -> None:
        self._outbox.append((rank, reason))
        self._wake.set()

    def abandon(self, reason: str) -> None:
        self._abandoned = True
        self.publish(self.rank, reason)

    def _run(self) -> None:
        # Both clocks start here, at init: a peer whose heartbeat connection never completes
        # is judged like one that stopped beating (rank 0: no beat for ``timeout``), and a
        # store that never answers like one that stopped answering (the other ranks).
        started = time.monotonic()
        prefix, last_ok = None, started
        seen = {peer: (0, started) for peer in range(1, self.world_size)}
        try:
            while True:
                try:
                    self._open(self._bound(last_ok))
                    prefix = prefix or self._join()
                    self._tick(prefix, seen)
                    last_ok = time.monotonic()
                except DistributedError as e:
                    if self._store_lost(e, time.monotonic() - last_ok):
                        return
                if self._stop.is_set():  # after one last tick, which published what was new
                    self._leave(prefix)
                    return
                self._wake.wait(self.config.interval)
                self._wake.clear()
        finally:
            if self._store is not None:
                self._store.close()

    def _bound(self, last_ok: float) -> float:
        """Seconds the next store requests may take: what is left of ``timeout`` since the
        store last answered, so that its silence is judged at ``timeout`` however many
        connection attempts or requests it spans (one unanswered handshake, then another,
        must not add up to twice the timeout). Rank 0 serves the store and never judges it."""
        if self.rank == 0:
            return self._request_timeout
        left = last_ok + self.config.timeout - time.monotonic()
        return max(left, _MIN_REQUEST_S)

    def _store_lost(self, error: DistributedError, silent: float) -> bool:
        """Judge a failed store request; True when there is nothing more to watch."""
        closed = not isinstance(error, CollectiveTimeoutError) and "went away" in str(error)
        if self.rank == 0 or (not closed and silent < self.config.timeout):
            return False
        host, port, _ = self._address
        if closed and self._rank0_leaving:
            self.note = "rank 0 left the job and closed the store"
            return True
        last = (f"last error: {error}" if self._connected else
                f"this rank's heartbeat could not connect to it: {error}")
        why = ("closed while rank 0 was still in the job (rank 0 died)" if closed else
               f"has not answered for {silent:.1f} s (rank 0 died, hung, or the network to it "
               f"is down; {last})")
        self._record(0, f"the store it serves at {host}:{port} {why}")
        self.note = "rank 0 declared failed"
        # Every survivor sees the same store: all find this within one interval.
        self.settle_s = self.config.interval + _NOTICE_S
        return True

    def _open(self, timeout: float) -> None:
        """Connect this monitor's own store client, or bound the one it has, by ``timeout``."""
        from ..rendezvous.store import TCPStore
        if self._store is not None:
            self._store.set_timeout(timeout)
            return
        host, port, secret = self._address
        self._store = TCPStore(host, port, secret=secret, timeout=timeout, rank=self.rank)
        self._connected = True

    def _join(self) -> str:
        # Every rank of a job adds 1 once, so all agree on the job's number even on a store
        # that an earlier job used.
        joined = self._store.add(f"{KEY_PREFIX}/joined", 1)
        return f"{KEY_PREFIX}/{(joined - 1) // self.world_size}"

    def _tick(self, prefix: str, seen: dict) -> None:
        store = self._store
        store.add(f"{prefix}/beat/{self.rank}", 1)
        news = self._judge(prefix, seen) if self.rank == 0 else []
        while self._outbox:
            news.append(self._outbox.popleft())
        if news:
            self._publish(prefix, {"failures": [{"rank": r, "reason": w} for r, w in news]})
        latest = store.add(f"{prefix}/failed_version", 0)
        for version in range(self._read + 1, latest + 1):
            key = f"{prefix}/failed/{version}"
            if version not in self._own and store.check([key]):
                listed = json.loads(store.get(key, timeout=self.config.interval))
                for item in listed.get("failures", ()):
                    self._record(int(item["rank"]), str(item["reason"]))
                self._rank0_leaving |= bool(listed.get("rank0_leaving"))
                store.set(f"{prefix}/heard/{version}/{self.rank}", b"1")
                if listed.get("failures"):
                    self._heard.append(version)
            elif version not in self._own:  # numbered, not written yet: look again next tick,
                since = self._unwritten.setdefault(version, time.monotonic())
                if time.monotonic() - since < self.config.timeout:  # unless its writer died
                    break
            self._read = version

    def _publish(self, prefix: str, payload: dict) -> None:
        version = self._store.add(f"{prefix}/failed_version", 1)
        self._own.append(version)
        self._store.set(f"{prefix}/failed/{version}", json.dumps(payload).encode())
        # its writer has read it too: a rank lingering until its peers have read it waits on
        # the others alone
        self._store.set(f"{prefix}/heard/{version}/{self.rank}", b"1")

    def _judge(self, prefix: str, seen: dict) -> list:
        """Rank 0: a peer whose counter stood still for ``timeout`` seconds has failed."""
        news, failed = [], {f.rank for f in heartbeat.failures()}
        for peer in range(1, self.world_size):
            if peer in self._left or peer in failed:
                continue
            count, now = self._store.add(f"{prefix}/beat/{peer}", 0), time.monotonic()
            if count >= LEFT_MARK:
                self._left.add(peer)
            elif peer not in seen or seen[peer][0] != count:
                seen[peer] = (count, now)
            elif now - seen[peer][1] >= self.config.timeout:
                reason = (f"no heartbeat for {now - seen[peer][1]:.1f} s" +
                          (" (killed, stopped, or cut off from rank 0)" if count else
                           ", none since init (killed, stopped, or cut off from rank 0 before "
                           "its heartbeat connected)"))
                if self._record(peer, reason):
                    news.append((peer, reason))
        return news

    def _leave(self, prefix: Optional[str]) -> None:
        if prefix is None or self._store is None:
            return
        try:
            if self._outbox:  # found, or abandoned, after the last tick had published
                news = [self._outbox.popleft() for _ in range(len(self._outbox))]
                self._publish(prefix, {"failures": [{"rank": r, "reason": w} for r, w in news]})
            # The mark stops rank 0 from taking this silence for a hang; a rank that abandons
            # the job has declared itself failed just before.
            self._store.add(f"{prefix}/beat/{self.rank}", LEFT_MARK)
            if self.rank == 0:  # the store closes with us: the others must know it is no crash
                self._publish(prefix, {"rank0_leaving": True})
            # After a failure, the lists that told of it, heard here or published here: a rank
            # that leaves before its peers have read them is what those peers see first, and
            # they would blame it (a pipeline stage two hops from the failed one, say)
            lists = (self._own + self._heard
                     if self.rank == 0 or heartbeat.failures() or self._abandoned else [])
            self._wait_until_heard(prefix, lists)
        except DistributedError:
            pass  # rank 0 is gone already: nobody is left to misjudge our silence

    def _wait_until_heard(self, prefix: str, versions: list) -> None:
        """Until every live peer has read ``versions`` or left (bounded by ``linger_s``)."""
        failed = {f.rank for f in heartbeat.failures()}
        pending = {(v, p) for v in versions for p in range(self.world_size)
                   if p != self.rank and p not in failed and p not in self._left}
        give_up = time.monotonic() + self.linger_s
        while pending and time.monotonic() < give_up:
            for version, peer in sorted(pending):
                if peer in self._left or self._store.check([f"{prefix}/heard/{version}/{peer}"]):
                    pending.discard((version, peer))
                elif self._store.add(f"{prefix}/beat/{peer}", 0) >= LEFT_MARK:
                    self._left.add(peer)
                    pending.discard((version, peer))
            if pending:
                time.sleep(0.02)
        if versions and (heartbeat.failures() or self._abandoned):
            time.sleep(_NOTICE_S)  # their wait loops look at what they heard every ~0.1 s
