"""The thread every heartbeat monitor runs in, and what ``heartbeat`` asks of a monitor.

A monitor reports what it finds through ``heartbeat.record_failure``, so that the failure list
lives in that module alone.
"""
from __future__ import annotations

import threading
import time

from . import heartbeat
from .heartbeat import HeartbeatConfig


class MonitorThread:
    """A daemon thread running ``_run()``, the monitor's loop, until ``stop``."""

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

    def tell_own_verdicts(self) -> None:
        """Tell the other ranks the verdicts this monitor reached and could not tell from its
        thread; called by a thread that may talk to the transport (``heartbeat.report``)."""

    def abandon(self, reason: str) -> None:
        """This rank is leaving without destroy_process_group: declare it failed, where this
        monitor can tell the other ranks (see ``heartbeat.stop``)."""

    def stop(self, wait: float) -> None:
        # A thread stuck on an unreachable store is left behind (a daemon; it gives up within
        # ``timeout``) rather than holding up destroy_process_group.
        self._stop.set()
        self._wake.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(wait)
        time.sleep(self.settle_s)

    def _record(self, rank: int, reason: str) -> bool:
        return heartbeat.record_failure(rank, reason, source=self)

    def _main(self) -> None:
        try:
            self._run()  # each monitor's loop
        except Exception as e:  # a monitor must never take the process down with it
            self.note = f"stopped by {type(e).__name__}: {e}"
