"""Failure detection: a heartbeat thread per process, and the cheap check wait loops call.

With a store (tcp, shm): every rank adds 1 to its counter in the rendezvous store every
``interval`` seconds, over a connection of its own. Rank 0, which serves the store, declares a
rank whose counter stood still for ``timeout`` seconds failed (killed, stopped, cut off); a
store silent for ``timeout`` seconds means rank 0 itself died, hung or is unreachable, and a
store that closes without rank 0 having announced its leaving means rank 0 died. Failures a
transport finds are shared the same way (``report``), so every rank names the same culprit.
Verdicts go out as numbered lists that every rank reads and acknowledges; whoever published one
(and rank 0, before it closes the store) waits, a bounded time, until every live rank has heard.

Without a store (mpi), same-host peers are watched by pid: one stopped (state T) for
``timeout`` seconds is declared hung. Peers on other hosts cannot be watched that way.

Wait loops call ``check(rank, op, seq)``: one global read while all is well, then a
``PeerFailureError`` naming the failed rank, ``op`` and ``seq``. Settings:
``NEURAL_ARCH_HEARTBEAT`` (``0``/``off`` disables it), ``NEURAL_ARCH_HEARTBEAT_INTERVAL``
(default 0.5 s), ``NEURAL_ARCH_HEARTBEAT_TIMEOUT`` (default 6 s).
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import CollectiveTimeoutError, DistributedError, PeerFailureError

ENABLE_ENV = "NEURAL_ARCH_HEARTBEAT"
INTERVAL_ENV = "NEURAL_ARCH_HEARTBEAT_INTERVAL"
TIMEOUT_ENV = "NEURAL_ARCH_HEARTBEAT_TIMEOUT"
DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S = 0.5, 6.0
LEFT_MARK = 1 << 40  # added to its counter by a rank that leaves cleanly
KEY_PREFIX = "neural_arch/heartbeat"
_STOP_WAIT_S = 2.0
_NOTICE_S = 0.3  # a verdict recorded here reaches a transport's wait loop within this long
_TRUE, _FALSE = ("1", "on", "true", "yes"), ("0", "off", "false", "no")


@dataclass(frozen=True)
class HeartbeatConfig:
    enabled: bool = True
    interval: float = DEFAULT_INTERVAL_S
    timeout: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Failure:
    rank: int
    reason: str
    detected_at: float  # time.time()


def config_from_env(environ: Optional[Mapping[str, str]] = None) -> HeartbeatConfig:
    """Read the settings; raise ValueError naming a malformed variable and its value."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENABLE_ENV, "1").strip().lower()
    if raw not in _TRUE + _FALSE:
        raise ValueError(f"{ENABLE_ENV}={environ[ENABLE_ENV]!r}: use one of {_TRUE + _FALSE}")
    values = []
    for name, default in ((INTERVAL_ENV, DEFAULT_INTERVAL_S), (TIMEOUT_ENV, DEFAULT_TIMEOUT_S)):
        text = environ.get(name, "").strip()
        try:
            values.append(float(text) if text else default)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number of seconds") from None
        if not 0 < values[-1] < 1e6:  # also rejects NaN
            raise ValueError(f"{name}={text!r} must be a positive number of seconds")
    interval, timeout = values
    if timeout < 2 * interval:
        raise ValueError(f"{TIMEOUT_ENV}={timeout} must be at least twice "
                         f"{INTERVAL_ENV}={interval}, or a healthy rank may look silent")
    return HeartbeatConfig(raw in _TRUE, interval, timeout)


# ----- what every wait loop reads ------------------------------------------------------------
_failures: Optional[tuple] = None  # of Failure; replaced whole, so reading needs no lock
_lock = threading.Lock()
_monitor = None  # the running StoreMonitor or PidMonitor


def check(rank: int, op: str, seq: Optional[int] = None) -> None:
    """Raise PeerFailureError once the heartbeat knows of a failed rank; else nothing."""
    known = _failures
    if known is None:
        return
    first = known[0]
    what = (f"this rank was declared failed: {first.reason}" if first.rank == rank
            else f"peer rank {first.rank} failed: {first.reason}")
    more = "".join(f"; peer rank {f.rank} failed: {f.reason}" for f in known[1:])
    raise PeerFailureError(f"heartbeat: {what}{more}", rank=rank, peer=first.rank, op=op,
                           seq=seq)


def record_failure(rank: int, reason: str, source=None) -> bool:
    """Remember that ``rank`` failed (the first reason stays); True when it was news.

    A monitor passes itself as ``source``: once it has been stopped, a late verdict of its
    thread is dropped rather than failing the next job.
    """
    global _failures
    with _lock:
        known = _failures or ()
        if (source is not None and source is not _monitor) or any(f.rank == rank for f in known):
            return False
        _failures = known + (Failure(int(rank), reason, time.time()),)
        return True


def report(error: PeerFailureError) -> None:
    """A transport found a failed peer: record it and tell the other ranks, so that they name
    that peer too, rather than this rank, which is about to leave because of it."""
    monitor, text = _monitor, str(error)
    if monitor is None or error.peer is None or "heartbeat: " in text:
        return
    reason = f"rank {error.rank} saw: {text.split('] ', 1)[-1]}"
    if record_failure(error.peer, reason, source=monitor):
        monitor.publish(error.peer, reason)


def reporting(fn):
    """``fn`` with any PeerFailureError it raises reported on the way out."""
    def run():
        try:
            return fn()
        except PeerFailureError as e:
            report(e)
            raise
    return run


def failures() -> tuple:
    return _failures or ()


def status() -> dict:
    """What ``get_distributed_info()["heartbeat"]`` reports."""
    monitor = _monitor
    info = {"mode": monitor.mode if monitor else "off",
            "running": bool(monitor and monitor.running),
            "failures": [{"rank": f.rank, "reason": f.reason, "detected_at": f.detected_at}
                         for f in failures()]}
    if monitor is not None:
        info.update(interval=monitor.config.interval, timeout=monitor.config.timeout,
                    note=monitor.note)
    return info


def start(rank: int, world_size: int, store=None, transport=None,
          config: Optional[HeartbeatConfig] = None) -> Optional[str]:
    """Start this process's monitor after rendezvous; returns its mode, or None when off."""
    global _monitor
    config = config_from_env() if config is None else config
    stop()
    if not config.enabled or world_size < 2:
        return None
    from .store import TCPStore
    pids = getattr(transport, "local_peer_pids", None)
    if isinstance(store, TCPStore):
        # Its own connection (a client is not shared between threads), with the same secret.
        address = (store.host, store.port, store._secret)
        _monitor = StoreMonitor(rank, world_size, address, config)
    elif pids:
        _monitor = PidMonitor(rank, dict(pids), config)
    else:
        return None
    _monitor.start()
    return _monitor.mode


def stop() -> None:
    """Stop the monitor (leaving cleanly) and forget recorded failures. Safe to call twice."""
    global _monitor, _failures
    monitor, _monitor = _monitor, None
    if monitor is not None:
        monitor.stop(_STOP_WAIT_S + monitor.linger_s)
    with _lock:
        _failures = None


def _process_state(pid: int) -> Optional[bytes]:
    """The one-letter state of ``pid`` from /proc, or None when it no longer runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in (b"Z", b"X", b"x") else state


# ----- the monitors ----------------------------------------------------------------------------
class _Monitor:
    mode = "off"
    # Leaving right after a failure would let the ranks that have not heard of it yet see this
    # rank leave first and blame it: stopping then lingers until they have heard (``linger_s``
    # bounds the thread's wait) or have surely found it themselves (``settle_s``).
    linger_s = 0.0
    settle_s = 0.0

    def __init__(self, rank: int, config: HeartbeatConfig) -> None:
        self.rank, self.config, self.note = rank, config, ""
        self._stop, self._wake = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"neural_arch-heartbeat-{rank}")

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    def publish(self, rank: int, reason: str) -> None:
        """Tell the other ranks, where this monitor can."""

    def stop(self, wait: float) -> None:
        # A thread stuck on an unreachable store is left behind (a daemon; it gives up within
        # ``timeout``) rather than holding up destroy_process_group.
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait)
        time.sleep(self.settle_s)

    def _record(self, rank: int, reason: str) -> bool:
        return record_failure(rank, reason, source=self)

    def _main(self) -> None:
        try:
            self._run()  # each monitor's loop
        except Exception as e:  # a monitor must never take the process down with it
            self.note = f"stopped by {type(e).__name__}: {e}"


class StoreMonitor(_Monitor):
    """Counters and failure lists in the rendezvous store (see the module's docstring)."""

    mode = "store"

    def __init__(self, rank: int, world_size: int, address: tuple,
                 config: HeartbeatConfig) -> None:
        super().__init__(rank, config)
        self.world_size, self._address, self._store = world_size, address, None
        self._left: set = set()  # peers known to have left cleanly
        self._read = 0  # the newest failure list read or written here
        self._own: list = []  # failure lists published here
        self._outbox: deque = deque()  # (rank, reason) found here, to be published
        self._unwritten: dict = {}  # failure list number -> when it was first seen missing
        self._rank0_leaving = False
        self.linger_s = 2 * config.interval + 0.5
        # A request unanswered for this long fails, so silence is noticed close to ``timeout``.
        self._request_timeout = max(config.timeout - config.interval, config.interval)

    def publish(self, rank: int, reason: str) -> None:
        self._outbox.append((rank, reason))
        self._wake.set()

    def _run(self) -> None:
        prefix, seen, last_ok = None, {}, time.monotonic()
        try:
            while True:
                try:
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

    def _store_lost(self, error: DistributedError, silent: float) -> bool:
        """Judge a failed store request; True when there is nothing more to watch."""
        closed = not isinstance(error, CollectiveTimeoutError) and "went away" in str(error)
        if self.rank == 0 or (not closed and silent < self.config.timeout):
            return False
        host, port, _ = self._address
        if closed and self._rank0_leaving:
            self.note = "rank 0 left the job and closed the store"
            return True
        why = ("closed while rank 0 was still in the job (rank 0 died)" if closed else
               f"has not answered for {silent:.1f} s (rank 0 died, hung, or the network to it "
               f"is down; last error: {error})")
        self._record(0, f"the store it serves at {host}:{port} {why}")
        self.note = "rank 0 declared failed"
        # Every survivor sees the same store: all find this within one interval.
        self.settle_s = self.config.interval + _NOTICE_S
        return True

    def _join(self) -> str:
        from .store import TCPStore
        host, port, secret = self._address
        if self._store is None:
            self._store = TCPStore(host, port, secret=secret, timeout=self._request_timeout)
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
            elif version not in self._own:  # numbered, not written yet: look again next tick,
                since = self._unwritten.setdefault(version, time.monotonic())
                if time.monotonic() - since < self.config.timeout:  # unless its writer died
                    break
            self._read = version

    def _publish(self, prefix: str, payload: dict) -> None:
        version = self._store.add(f"{prefix}/failed_version", 1)
        self._own.append(version)
        self._store.set(f"{prefix}/failed/{version}", json.dumps(payload).encode())

    def _judge(self, prefix: str, seen: dict) -> list:
        """Rank 0: a peer whose counter stood still for ``timeout`` seconds has failed."""
        news, failed = [], {f.rank for f in failures()}
        for peer in range(1, self.world_size):
            if peer in self._left or peer in failed:
                continue
            count, now = self._store.add(f"{prefix}/beat/{peer}", 0), time.monotonic()
            if count >= LEFT_MARK:
                self._left.add(peer)
            elif peer not in seen or seen[peer][0] != count:
                seen[peer] = (count, now)
            elif now - seen[peer][1] >= self.config.timeout:
                reason = (f"no heartbeat for {now - seen[peer][1]:.1f} s (killed, stopped, or "
                          "cut off from rank 0)")
                if self._record(peer, reason):
                    news.append((peer, reason))
        return news

    def _leave(self, prefix: Optional[str]) -> None:
        if prefix is None or self._store is None:
            return
        try:
            self._store.add(f"{prefix}/beat/{self.rank}", LEFT_MARK)
            if self.rank == 0:  # the store closes with us: the others must know it is no crash
                self._publish(prefix, {"rank0_leaving": True})
            lists = self._own if self.rank == 0 or failures() else []
            self._wait_until_heard(prefix, lists)
        except DistributedError:
            pass  # rank 0 is gone already: nobody is left to misjudge our silence

    def _wait_until_heard(self, prefix: str, versions: list) -> None:
        """Until every live peer has read ``versions`` or left (bounded by ``linger_s``)."""
        failed = {f.rank for f in failures()}
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
        if versions and failures():
            time.sleep(_NOTICE_S)  # their wait loops look at what they heard every ~0.1 s


class PidMonitor(_Monitor):
    """No store: watch same-host peers by pid, and declare one stopped for ``timeout`` hung."""

    mode = "pids"

    def __init__(self, rank: int, pids: dict, config: HeartbeatConfig) -> None:
        super().__init__(rank, config)
        self._pids = dict(pids)
        self.note = (f"same-host peers {sorted(self._pids)} are watched by pid; peers on other "
                     "hosts are not watched")

    def _run(self) -> None:
        stopped_since: dict = {}
        while not self._stop.wait(self.config.interval):
            for peer, pid in list(self._pids.items()):
                state, now = _process_state(pid), time.monotonic()
                if state is None:  # it exited: the transport reports that if it matters
                    del self._pids[peer]
                elif state in (b"T", b"t"):
                    since = stopped_since.setdefault(peer, now)
                    if now - since >= self.config.timeout:
                        del self._pids[peer]
                        self._record(peer, f"its process (pid {pid}) has been stopped for "
                                           f"{now - since:.1f} s")
                else:
                    stopped_since.pop(peer, None)
