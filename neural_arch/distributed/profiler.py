"""``CommunicationProfiler``: time, bytes and bandwidth of communication, per operation name.

Two ways to feed it:
- explicitly, around any code: ``with profiler.profile_operation("gradient_sync", nbytes):``;
- for every collective of the process: ``with trace_collectives(profiler):`` (or
  ``set_collective_tracer``) makes the process-group layer report each collective it runs
  through ``trace_collective`` / ``notify_collective``, timed where the transfer really runs
  (on the communication thread for ``async_op=True``).

Besides per-name statistics the profiler keeps a timeline of events (the newest ``max_events``)
that ``export_chrome_trace`` writes as Chrome/Perfetto trace JSON: one ``"X"`` event per
operation, ``ts``/``dur`` in microseconds, ``pid`` = rank, ``tid`` = thread.
"""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import deque
from typing import Any, Callable, Dict, Iterator, Optional

import numpy as np

from .._files import write_whole


class _OpStats:
    __slots__ = ("count", "total_s", "min_s", "max_s", "total_bytes")

    def __init__(self) -> None:
        self.count, self.total_s, self.total_bytes = 0, 0.0, 0
        self.min_s, self.max_s = float("inf"), 0.0

    def add(self, seconds: float, nbytes: int) -> None:
        self.count += 1
        self.total_s += seconds
        self.total_bytes += nbytes
        self.min_s = min(self.min_s, seconds)
        self.max_s = max(self.max_s, seconds)

    def summary(self) -> Dict[str, float]:
        return {"count": self.count, "total_time_ms": self.total_s * 1e3,
                "avg_time_ms": self.total_s * 1e3 / self.count,
                "min_time_ms": self.min_s * 1e3, "max_time_ms": self.max_s * 1e3,
                "total_bytes": self.total_bytes,
                "bandwidth_mbps": self.total_bytes / 1e6 / self.total_s if self.total_s > 0
                else 0.0}


def _current_rank() -> int:
    from .group.world import get_rank, is_initialized
    return get_rank() if is_initialized() else 0


class CommunicationProfiler:
    """Per-operation communication statistics and a trace timeline (thread-safe).

    Times come from ``time.perf_counter()``; ``record``'s ``start`` is such a value.
    Bandwidth is bytes / 1e6 / seconds (MB/s) over all calls of an operation.
    """

    def __init__(self, enabled: bool = True, max_events: int = 100_000,
                 rank: Optional[int] = None) -> None:
        if isinstance(max_events, bool) or not isinstance(max_events, (int, np.integer)) \
                or max_events < 0:
            raise ValueError(f"CommunicationProfiler max_events must be an int >= 0, "
                             f"got {max_events!r}")
        self.enabled = bool(enabled)
        self.rank = _current_rank() if rank is None else int(rank)
        self._lock = threading.Lock()
        self._stats: Dict[str, _OpStats] = {}
        self._events: deque = deque(maxlen=int(max_events))
        # perf_counter has no fixed epoch; anchor it to wall time so ranks' traces line up.
        self._origin_perf = time.perf_counter()
        self._origin_wall_us = time.time() * 1e6

    @contextlib.contextmanager
    def profile_operation(self, name: str, bytes_transferred: int = 0) -> Iterator[None]:
        """Time the body as one call of ``name`` moving ``bytes_transferred`` bytes."""
        if not self.enabled:
            yield
            return
        _check_name_and_bytes(name, bytes_transferred)
        start = time.perf_counter()
        try:
            yield
        finally:
            self.record(name, time.perf_counter() - start, bytes_transferred, start=start)

    def record(self, name: str, seconds: float, bytes_transferred: int = 0,
               start: Optional[float] = None) -> None:
        """Add one call of ``name`` that took ``seconds`` (``start``: its perf_counter time)."""
        if not self.enabled:
            return
        _check_name_and_bytes(name, bytes_transferred)
        seconds = float(seconds)
        if not seconds >= 0.0:
            raise ValueError(f"record({name!r}): seconds must be >= 0, got {seconds}")
        if start is None:
            start = time.perf_counter() - seconds
        event = {"name": name, "ph": "X",
                 "ts": self._origin_wall_us + (start - self._origin_perf) * 1e6,
                 "dur": seconds * 1e6, "pid": self.rank, "tid": threading.get_native_id(),
                 "args": {"bytes": int(bytes_transferred)}}
        with self._lock:
            self._stats.setdefault(name, _OpStats()).add(seconds, int(bytes_transferred))
            self._events.append(event)

    def notify_collective(self, name: str, nbytes: int, start: float, end: float) -> None:
        """Hook for the collective layer: ``name`` ran from ``start`` to ``end``
        (``time.perf_counter()`` values) and moved ``nbytes`` bytes of this rank's buffer."""
        self.record(name, max(0.0, end - start), nbytes, start=start)

    def get_statistics(self) -> Dict[str, Dict[str, float]]:
        """``{name: {count, total_time_ms, avg_time_ms, min_time_ms, max_time_ms, total_bytes,
        bandwidth_mbps}}``."""
        with self._lock:
            return {name: stats.summary() for name, stats in self._stats.items()}

    def events(self) -> list:
        """The timeline, oldest first (copies of the trace events)."""
        with self._lock:
            return [dict(e, args=dict(e["args"])) for e in self._events]

    def reset(self) -> None:
        with self._lock:
            self._stats.clear()
            self._events.clear()

    def export_chrome_trace(self, path: str) -> None:
        """Write the timeline as Chrome/Perfetto trace JSON (open in ui.perfetto.dev)."""
        trace = {"traceEvents": self.events(), "displayTimeUnit": "ms"}
        write_whole(path, json.dumps(trace), f"{path}.tmp{os.getpid()}")

    def __repr__(self) -> str:
        return (f"CommunicationProfiler(enabled={self.enabled}, rank={self.rank}, "
                f"operations={sorted(self._stats)})")


def _check_name_and_bytes(name: Any, nbytes: Any) -> None:
    if not isinstance(name, str) or not name:
        raise TypeError(f"operation name must be a non-empty str, got {name!r}")
    if isinstance(nbytes, bool) or not isinstance(nbytes, (int, np.integer)) or nbytes < 0:
        raise ValueError(f"bytes_transferred of {name!r} must be an int >= 0, got {nbytes!r}")


# ---------------------------------------------------------------- process-wide collective tracing
# The active tracer (None: none). The public collectives read it as ``profiler.TRACER`` on
# every call, one attribute test, rather than calling ``current_tracer()``.
TRACER: Optional[CommunicationProfiler] = None


def set_collective_tracer(profiler: Optional[CommunicationProfiler]
                          ) -> Optional[CommunicationProfiler]:
    """Make ``profiler`` record every collective of this process (None: stop); returns the
    previous tracer."""
    global TRACER
    if profiler is not None and not isinstance(profiler, CommunicationProfiler):
        raise TypeError(f"set_collective_tracer needs a CommunicationProfiler or None, got "
                        f"{type(profiler).__name__}")
    previous, TRACER = TRACER, profiler
    return previous


def current_tracer() -> Optional[CommunicationProfiler]:
    return TRACER


@contextlib.contextmanager
def trace_collectives(profiler: CommunicationProfiler) -> Iterator[CommunicationProfiler]:
    """Record every collective run inside the block into ``profiler``."""
    previous = set_collective_tracer(profiler)
    try:
        yield profiler
    finally:
        set_collective_tracer(previous)


def notify_collective(name: str, nbytes: int, start: float, end: float) -> None:
    """Report one finished collective to the active tracer, if any."""
    tracer = TRACER
    if tracer is not None:
        tracer.notify_collective(name, nbytes, start, end)


def trace_collective(fn: Callable[[], Any], name: str, fp: Any) -> Callable[[], Any]:
    """``fn`` itself when no tracer is active, else ``fn`` wrapped to report its run.

    ``fp`` is the collective's fingerprint (``dtype`` name and element ``count``) or None;
    the bytes reported are this rank's buffer size. Meant for ``ProcessGroup.run``.
    """
    tracer = TRACER
    if tracer is None:
        return fn
    nbytes = int(fp.count) * np.dtype(fp.dtype).itemsize if fp is not None else 0

    def timed() -> Any:
        start = time.perf_counter()
        try:
            return fn()
        finally:
            tracer.notify_collective(name, nbytes, start, time.perf_counter())
    return timed
