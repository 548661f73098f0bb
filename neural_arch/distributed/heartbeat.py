"""Failure detection: one heartbeat thread per process, and the cheap check wait loops call.

Through the store (tcp, shm, and mpi when given a store): every rank adds 1 to its counter in
the rendezvous store every ``interval`` seconds, over a connection of its own. Rank 0, which
serves the store, reads every counter on each tick; a counter that has not moved for
``timeout`` seconds marks its rank failed (killed, stopped, or cut off from rank 0), and rank 0
publishes the failed ranks in the store, where every other rank reads them on its next tick. A
store that stops answering for ``timeout`` seconds means rank 0 itself died, hung or is
unreachable. A store that closes its connection means rank 0 has left (or crashed, which the
transports see themselves): the thread then stops quietly. A rank leaving cleanly marks its
counter, so its silence is never taken for a failure.

Without a store (mpi), same-host peers are watched by pid: one stopped (state T) for
``timeout`` seconds is declared hung. Peers on other hosts cannot be watched that way.

Transports call ``check(rank, op, seq)`` while they wait: one global read while all is well;
once a failure is known it raises ``PeerFailureError`` naming the failed rank, ``op`` and ``seq``.
Configuration: ``NEURAL_ARCH_HEARTBEAT`` (``0``/``off`` disables it),
``NEURAL_ARCH_HEARTBEAT_INTERVAL`` (default 0.5 s), ``NEURAL_ARCH_HEARTBEAT_TIMEOUT`` (default 6 s).
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Optional

from .errors import CollectiveTimeoutError, DistributedError, PeerFailureError

ENABLE_ENV = "NEURAL_ARCH_HEARTBEAT"
INTERVAL_ENV = "NEURAL_ARCH_HEARTBEAT_INTERVAL"
TIMEOUT_ENV = "NEURAL_ARCH_HEARTBEAT_TIMEOUT"
DEFAULT_INTERVAL_S = 0.5
DEFAULT_TIMEOUT_S = 6.0
LEFT_MARK = 1 << 40  # added to a counter by a rank that leaves cleanly
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
    detected_at: float  # time.time(), so that it can be compared across processes of one host


def config_from_env(environ: Optional[Mapping[str, str]] = None) -> HeartbeatConfig:
    """Read the heartbeat settings; raise ValueError naming a malformed variable and value."""
    environ = os.environ if environ is None else environ
    raw = environ.get(ENABLE_ENV, "1").strip().lower()
    if raw not in _TRUE + _FALSE:
        raise ValueError(f"{ENABLE_ENV}={environ[ENABLE_ENV]!r}: use one of {_TRUE + _FALSE}")
    values = {}
    for name, default in ((INTERVAL_ENV, DEFAULT_INTERVAL_S), (TIMEOUT_ENV, DEFAULT_TIMEOUT_S)):
        text = environ.get(name, "").strip()
        try:
            values[name] = float(text) if text else default
        except ValueError:
            raise ValueError(f"{name}={text!r} is not a number of seconds") from None
        if not 0 < values[name] < 1e6:  # also rejects NaN
            raise ValueError(f"{name}={text!r} must be a positive number of seconds")
    interval, timeout = values[INTERVAL_ENV], values[TIMEOUT_ENV]
    if timeout < 2 * interval:
        raise ValueError(f"{TIMEOUT_ENV}={timeout} must be at least twice "
                         f"{INTERVAL_ENV}={interval}, or a healthy rank may look silent")
    return HeartbeatConfig(raw in _TRUE, interval, timeout)


# ----- what every wait loop reads ------------------------------------------------------------
_failures: Optional[tuple] = None  # tuple of Failure; replaced whole, so reads need no lock
_lock = threading.Lock()
_monitor = None  # the running StoreMonitor / PidMonitor, if any


def check(rank: int, op: str, seq: Optional[int] = None) -> None:
    """Raise PeerFailureError when the heartbeat has declared a rank failed; else nothing."""
    failures = _failures
    if failures is not None:
        raise failure_error(failures, rank, op, seq)


def failure_error(failures, rank: int, op: str, seq: Optional[int]) -> PeerFailureError:
    first = failures[0]
    if first.rank == rank:
        what = f"this rank was declared failed: {first.reason}"
    else:
        what = f"peer rank {first.rank} failed: {first.reason}"
    more = "".join(f"; peer rank {f.rank} failed: {f.reason}" for f in failures[1:])
    return PeerFailureError(f"heartbeat: {what}{more}", rank=rank, peer=first.rank, op=op,
                            seq=seq)


def record_failure(rank: int, reason: str, source=None) -> bool:
    """Remember that ``rank`` failed (first reason wins); True when it was news.

    A monitor passes itself as ``source``: once it has been replaced or stopped, a late verdict
    of its thread is dropped instead of failing the next job.
    """
    global _failures
    with _lock:
        if source is not None and source is not _monitor:
            return False
        known = _failures or ()
        if any(f.rank == rank for f in known):
            return False
        _failures = known + (Failure(int(rank), reason, time.time()),)
        return True


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
    """Start this process's monitor (after rendezvous); returns its mode or None when off."""
    global _monitor, _failures
    config = config_from_env() if config is None else config
    stop()
    with _lock:
        _failures = None
    if not config.enabled or world_size < 2:
        return None
    address = store_address(store)
    if address is not None:
        _monitor = StoreMonitor(rank, world_size, address, config)
    else:
        pids = getattr(transport, "local_peer_pids", None)
        if not pids:
            return None
        _monitor = PidMonitor(rank, dict(pids), config)
    _monitor.start()
    return _monitor.mode


def stop() -> None:
    """Stop the monitor (leaving cleanly) and forget recorded failures. Safe to call twice."""
    global _monitor, _failures
    monitor, _monitor = _monitor, None
    if monitor is not None:
        monitor.stop(_STOP_WAIT_S + monitor.linger_s)  # lingers only after a failure
    with _lock:
        _failures = None


def store_address(store) -> Optional[tuple]:
    """(host, port, secret) to open a second connection to ``store``; None if it is no TCPStore."""
    from .store import TCPStore
    if not isinstance(store, TCPStore):
        return None
    # The monitor needs a connection of its own (a client is not shared between threads), so
    # it reuses the secret this store authenticated with.
    return store.host, store.port, store._secret


def store_closed(error: BaseException) -> bool:
    """True when the store's host closed the connection (it left), not merely went silent."""
    return not isinstance(error, CollectiveTimeoutError) and "went away" in str(error)


def decode_failures(blob: bytes) -> tuple:
    """([(rank, reason), ...], how many ranks must hear it) from rank 0's published verdict."""
    try:
        verdict = json.loads(bytes(blob))
        return ([(int(f["rank"]), str(f["reason"])) for f in verdict["failures"]],
                int(verdict["expect"]))
    except (ValueError, KeyError, TypeError):
        return [], 0


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

    def __init__(self, rank: int, config: HeartbeatConfig) -> None:
        self.rank, self.config, self.note = rank, config, ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True,
                                        name=f"neural_arch-heartbeat-{rank}")

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def start(self) -> None:
        self._thread.start()

    # Leaving right after a verdict would make the survivors that have not heard it yet see
    # this rank leave first, and blame it. So stopping lingers, a bounded time, until they have
    # heard (``linger_s``, by the thread) or surely reached the verdict themselves (``settle_s``).
    linger_s = 0.0
    settle_s = 0.0

    def stop(self, wait: float) -> None:
        # A thread stuck on an unreachable store is left behind (it is a daemon and gives up
        # within ``timeout``) rather than holding up destroy_process_group.
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait)
        time.sleep(self.settle_s)

    def _record(self, rank: int, reason: str) -> bool:
        return record_failure(rank, reason, source=self)

    def _main(self) -> None:
        try:
            self._run()  # defined by each monitor
        except Exception as e:  # a monitor must never take the process down with it
            self.note = f"stopped by {type(e).__name__}: {e}"


class StoreMonitor(_Monitor):
    """Counters in the rendezvous store: every rank beats, rank 0 judges, the others listen."""

    mode = "store"

    def __init__(self, rank: int, world_size: int, address: tuple,
                 config: HeartbeatConfig) -> None:
        super().__init__(rank, config)
        self.world_size = world_size
        self._address = address
        self._store = None
        self._settled: set = set()  # peers that left or were declared failed
        self._verdict = (0, 0)  # (version of the failure list known here, ranks to hear it)
        self.linger_s = 2 * config.interval + 0.5
        # A request unanswered for this long fails, so silence is noticed close to ``timeout``.
        self._request_timeout = max(config.timeout - config.interval, config.interval)

    def _run(self) -> None:
        host, port, _ = self._address
        prefix, seen, version = None, {}, 0
        last_ok = time.monotonic()
        try:
            while True:
                try:
                    prefix = prefix or self._join()
                    version = self._tick(prefix, seen, version)
                    last_ok = time.monotonic()
                except DistributedError as e:
                    if store_closed(e):
                        self.note = "the store closed its connection: rank 0 has left"
                        return
                    silent = time.monotonic() - last_ok
                    if self.rank != 0 and silent >= self.config.timeout:
                        self._record(0, f"the store it serves at {host}:{port} has not "
                                          f"answered for {silent:.1f} s (rank 0 died, hung, "
                                          f"or the network to it is down; last error: {e})")
                        self.note = "rank 0 declared failed"
                        # Every survivor watches the same silent store: all get there within
                        # one interval.
                        self.settle_s = self.config.interval + _NOTICE_S
                        return
                if self._stop.wait(self.config.interval):
                    self._leave(prefix)
                    return
        finally:
            if self._store is not None:
                self._store.close()

    def _join(self) -> str:
        from .store import TCPStore
        host, port, secret = self._address
        if self._store is None:
            self._store = TCPStore(host, port, secret=secret, timeout=self._request_timeout)
        # Every rank of a job adds 1 once, so all agree on the job's number even on a store
        # that an earlier job used.
        joined = self._store.add(f"{KEY_PREFIX}/joined", 1)
        return f"{KEY_PREFIX}/{(joined - 1) // self.world_size}"

    def _tick(self, prefix: str, seen: dict, version: int) -> int:
        store = self._store
        store.add(f"{prefix}/beat/{self.rank}", 1)
        if self.rank == 0:
            self._judge(prefix, seen)
            return version
        latest = store.add(f"{prefix}/failed_version", 0)
        if latest != version:
            listed, expect = decode_failures(store.get(f"{prefix}/failed",
                                                       timeout=self.config.timeout))
            for rank, reason in listed:
                self._record(rank, reason)
            store.add(f"{prefix}/failed_seen/{latest}", 1)
            self._verdict = (latest, expect)
        return latest

    def _judge(self, prefix: str, seen: dict) -> None:
        """Rank 0: a peer whose counter stood still for ``timeout`` seconds has failed."""
        news = False
        for peer in range(1, self.world_size):
            if peer in self._settled:
                continue
            count = self._store.add(f"{prefix}/beat/{peer}", 0)
            now = time.monotonic()
            if count >= LEFT_MARK:
                self._settled.add(peer)
            elif peer not in seen or seen[peer][0] != count:
                seen[peer] = (count, now)
            elif now - seen[peer][1] >= self.config.timeout:
                self._settled.add(peer)
                news |= self._record(peer, f"no heartbeat for {now - seen[peer][1]:.1f} s "
                                             "(killed, stopped, or cut off from rank 0)")
        if news:
            listed = [{"rank": f.rank, "reason": f.reason} for f in failures()]
            expect = self.world_size - 1 - len(self._settled)  # the live peers must hear it
            self._store.set(f"{prefix}/failed",
                            json.dumps({"failures": listed, "expect": expect}).encode())
            self._verdict = (self._store.add(f"{prefix}/failed_version", 1), expect)

    def _leave(self, prefix: Optional[str]) -> None:
        if prefix is None or self._store is None:
            return
        try:
            self._store.add(f"{prefix}/beat/{self.rank}", LEFT_MARK)
            if self._verdict[0]:
                self._linger(prefix)
        except DistributedError:
            pass  # rank 0 is gone already: nobody is left to misjudge our silence

    def _linger(self, prefix: str) -> None:
        """Stay until every live rank has read the verdict (rank 0 also serves the store)."""
        version, expect = self._verdict
        give_up = time.monotonic() + self.linger_s
        while time.monotonic() < give_up and \
                self._store.add(f"{prefix}/failed_seen/{version}", 0) < expect:
            time.sleep(0.02)
        time.sleep(_NOTICE_S)  # their wait loops look at the verdict every ~0.1 s


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
