"""Failure detection: a heartbeat thread per process, and the cheap check wait loops call.

With a store (tcp, shm, and mpi jobs spanning hosts, see ``mpi_heartbeat``): every rank adds 1 to its counter in the rendezvous store every
``interval`` seconds, over a connection of its own. Rank 0, which serves the store, declares a
rank whose counter stood still for ``timeout`` seconds failed (killed, stopped, cut off); a
store silent for ``timeout`` seconds means rank 0 itself died, hung or is unreachable, and a
store that closes without rank 0 having announced its leaving means rank 0 died. Failures a
transport finds are shared the same way (``report``), so every rank names the same culprit,
and so is a rank's own leaving through the exit hooks without ``destroy_process_group``.
Verdicts go out as numbered lists that every rank reads and acknowledges; a rank that leaves
after a failure, whether it published the verdict or only heard it (and rank 0, before it closes
the store), waits, a bounded time, until every live rank has heard it.

Without a store (mpi on one host), peers are watched by pid: one stopped (state T) for
``timeout`` seconds is declared hung.

Wait loops call ``check(rank, op, seq)``: one global read while all is well, then a
``PeerFailureError`` naming the failed rank, ``op`` and ``seq``. Settings:
``NEURAL_ARCH_HEARTBEAT`` (``0``/``off`` disables it), ``NEURAL_ARCH_HEARTBEAT_INTERVAL``
(default 0.5 s), ``NEURAL_ARCH_HEARTBEAT_TIMEOUT`` (default 6 s).
"""
from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from typing import Mapping, Optional

from ..errors import PeerFailureError

ENABLE_ENV = "NEURAL_ARCH_HEARTBEAT"
INTERVAL_ENV = "NEURAL_ARCH_HEARTBEAT_INTERVAL"
TIMEOUT_ENV = "NEURAL_ARCH_HEARTBEAT_TIMEOUT"
DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S = 0.5, 6.0
LEFT_MARK = 1 << 40  # added to its counter by a rank that leaves cleanly
KEY_PREFIX = "neural_arch/heartbeat"
ABANDONED_REASON = ("it left the job without destroy_process_group (its program ended or an "
                    "exception escaped it while the process group was in use)")
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
_monitor = None  # the running StoreMonitor or PidMonitor (see heartbeat_monitors)


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
    if monitor is None or error.peer is None:
        return
    if "heartbeat: " in text:  # the monitor's own verdict: told already, unless it cannot
        monitor.tell_own_verdicts()
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
    # Imported here: the monitors import this module, which holds the state they report to.
    from .monitors import PidMonitor, StoreMonitor
    from ..rendezvous.store import TCPStore
    pids = getattr(transport, "local_peer_pids", None)
    if isinstance(store, TCPStore):
        # Its own connection (a client is not shared between threads), with the same secret.
        address = (store.host, store.port, store._secret)
        _monitor = StoreMonitor(rank, world_size, address, config)
    elif pids:
        # Without a store, a transport that can tell its peers (mpi) carries published failures.
        _monitor = PidMonitor(rank, dict(pids), config,
                              publish=getattr(transport, "publish_failure", None))
    else:
        return None
    _monitor.start()
    return _monitor.mode


def stop(abandoned: bool = False) -> None:
    """Stop the monitor and forget recorded failures. Safe to call twice.

    ``abandoned``: the process is exiting with its process group still initialized (its
    program ended or raised without ``destroy_process_group``). Peers may still be waiting
    for it in a collective, so it is declared failed to them, before its connections close,
    rather than leaving cleanly: each then names this rank, not a peer that left because of it.
    """
    global _monitor, _failures
    monitor, _monitor = _monitor, None
    if monitor is not None:
        if abandoned:
            monitor.abandon(ABANDONED_REASON)
        monitor.stop(_STOP_WAIT_S + monitor.linger_s)
    with _lock:
        _failures = None
