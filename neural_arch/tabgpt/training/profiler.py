"""``CommunicationProfiler`` as the TabGPT guide calls it: ``start_operation`` /
``end_operation`` around any communication, ``get_communication_stats()`` per operation name.

It is the project's profiler (``neural_arch.distributed.profiler.CommunicationProfiler``: the
per-name statistics, the timeline and its Chrome trace export, ``trace_collectives``) with the
guide's calls on top; the numbers are measured with ``time.perf_counter`` around the calls.
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any, Dict, Tuple

from ...distributed.profiler import CommunicationProfiler as _ProjectProfiler
from ...distributed.profiler import _check_name_and_bytes

__all__ = ["CommunicationProfiler"]


class CommunicationProfiler(_ProjectProfiler):
    """``get_communication_stats()[name]``: ``count``, ``total_time_ms``, ``avg_time_ms``,
    ``min_time_ms``, ``max_time_ms``, ``total_bytes``, ``bandwidth_mbps`` and
    ``avg_bandwidth_mbps`` (both bytes / 1e6 / seconds over the operation's calls: MB/s)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._open: Dict[int, Tuple[str, int, float]] = {}
        self._ids = itertools.count(1)
        self._open_lock = threading.Lock()

    def start_operation(self, name: str, data_size_bytes: int = 0) -> int:
        """Start timing one call of ``name`` moving ``data_size_bytes``; returns its id."""
        _check_name_and_bytes(name, data_size_bytes)  # now, not when the call ends
        with self._open_lock:
            op_id = next(self._ids)
            self._open[op_id] = (name, data_size_bytes, time.perf_counter())
        return op_id

    def end_operation(self, op_id: int) -> float:
        """End the call ``op_id`` (from ``start_operation``); returns its seconds."""
        end = time.perf_counter()
        with self._open_lock:
            try:
                name, nbytes, start = self._open.pop(op_id)
            except KeyError:
                raise ValueError(f"end_operation({op_id!r}): no operation with that id is "
                                 f"running (ids come from start_operation, and end once)"
                                 ) from None
        self.record(name, end - start, nbytes, start=start)
        return end - start

    def get_communication_stats(self) -> Dict[str, Dict[str, float]]:
        stats = self.get_statistics()
        for values in stats.values():
            values["avg_bandwidth_mbps"] = values["bandwidth_mbps"]
        return stats

    def __getstate__(self) -> Dict[str, Any]:  # travels to workers without its locks
        return {"enabled": self.enabled, "rank": self.rank,
                "max_events": self._events.maxlen}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(enabled=state["enabled"], max_events=state["max_events"],
                      rank=state["rank"])
