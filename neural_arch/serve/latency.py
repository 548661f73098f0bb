"""``LatencyRecord``: the latest durations of one kind (a request's time in the batcher, a
batch's model call), numbered from the server's start, summarised in milliseconds.

``summary_ms(since)`` takes the durations recorded after the first ``since``, so a load test
reads the count once its measured window opens and asks for that window alone (warm-up and
earlier runs left out). Only the last ``keep`` durations are kept; a window reaching further
back is summarised over what is kept, and ``count`` says how many that was.
"""
from __future__ import annotations

import threading
from collections import deque
from typing import Any, Deque, Dict

import numpy as np

__all__ = ["LatencyRecord"]


class LatencyRecord:
    def __init__(self, keep: int = 100_000) -> None:
        self._lock = threading.Lock()  # written by the batching thread, read by the HTTP loop
        self._seconds: Deque[float] = deque(maxlen=keep)
        self.recorded = 0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds.append(seconds)
            self.recorded += 1

    def summary_ms(self, since: int = 0) -> Dict[str, Any]:
        """``count`` durations recorded after the first ``since``, their p50, p99 and max in
        milliseconds (None when there are none), and ``recorded``, the number so far."""
        if isinstance(since, bool) or not isinstance(since, int) or since < 0:
            raise ValueError(f"LatencyRecord.summary_ms: since must be an integer >= 0, got "
                             f"{since!r}")
        with self._lock:
            recorded, kept = self.recorded, np.array(self._seconds)
        window = kept[len(kept) - min(len(kept), max(recorded - since, 0)):]
        if not len(window):
            return {"count": 0, "recorded": recorded, "p50": None, "p99": None, "max": None}
        p50, p99 = np.percentile(window, [50, 99]) * 1e3
        return {"count": len(window), "recorded": recorded, "p50": float(p50),
                "p99": float(p99), "max": float(window.max() * 1e3)}
