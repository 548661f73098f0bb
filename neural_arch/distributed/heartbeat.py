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


def record_failure(rank: int, reason: str) -> bool:
    """Remember that ``rank`` failed (first reason wins); True when it was news."""
    global _failures
    with _lock:
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
        monitor.stop(_STOP_WAIT_S)
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


def store_error_kind(error: BaseException) -> str:
    """"silent" for an unanswered request, "gone" for a closed or refused store connection."""
    if isinstance(error, CollectiveTimeoutError):
        return "silent"
    if isinstance(error, DistributedError) and "went away" in str(error):
        return "gone"
    return "silent"


def encode_failures(items) -> bytes:
    return json.dumps([{"rank": f.rank, "reason": f.reason} for f in items]).encode()


def decode_failures(blob: bytes) -> list:
    try:
        items = json.loads(bytes(blob).decode())
        return [(int(item["rank"]), str(item["reason"])) for item in items]
    except (ValueError, KeyError, TypeError):
        return []
