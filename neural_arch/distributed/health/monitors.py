"""The heartbeat's monitor threads: counters in the rendezvous store, or same-host pids.

The protocol is described in ``heartbeat``'s module docstring. ``StoreMonitor`` (in
``store_monitor``) runs it on the store; ``PidMonitor``, here, watches same-host peers by pid
where there is no store. Both run in a ``MonitorThread`` and report what they find through
``heartbeat.record_failure``, so that the failure list lives in that module alone.
"""
from __future__ import annotations

import threading
import time
from typing import Optional

from .heartbeat import HeartbeatConfig
from .monitor_thread import MonitorThread
# Re-exported: ``heartbeat`` starts either monitor from this module.
from .store_monitor import StoreMonitor

__all__ = ["PidMonitor", "StoreMonitor"]


def _process_state(pid: int) -> Optional[bytes]:
    """The one-letter state of ``pid`` from /proc, or None when it no longer runs."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None
    return None if state in (b"Z", b"X", b"x") else state


class PidMonitor(MonitorThread):
    """No store: watch same-host peers by pid, and declare one stopped for ``timeout`` hung."""

    mode = "pids"

    def __init__(self, rank: int, pids: dict, config: HeartbeatConfig, publish=None) -> None:
        super().__init__(rank, config)
        self._pids = dict(pids)
        self._publish = publish  # (rank, reason) -> None: the transport's word to its peers
        # Verdicts this thread reached: it may not call MPI itself (the transport's thread
        # level), so the rank that raises for one tells its peers on the way out
        # (``tell_own_verdicts``). Left untold, a peer that had not yet seen the stop itself
        # would see this rank leave first and name it instead of the stopped rank.
        self._untold: list = []
        self._untold_lock = threading.Lock()
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
                        reason = f"its process (pid {pid}) has been stopped for {now - since:.1f} s"
                        if self._record(peer, reason):
                            with self._untold_lock:
                                self._untold.append((peer, f"rank {self.rank} saw: {reason}"))
                else:
                    stopped_since.pop(peer, None)

    def publish(self, rank: int, reason: str) -> None:
        if self._publish is not None:
            self._publish(rank, reason)

    def tell_own_verdicts(self) -> None:
        with self._untold_lock:
            untold, self._untold = self._untold, []
        for rank, reason in untold:
            self.publish(rank, reason)
