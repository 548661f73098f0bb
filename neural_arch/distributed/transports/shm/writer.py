"""Writing into the shared workspace: plain copies, or streaming stores while those are faster.

A rank rewriting the area its peer read a round ago must first take the cache lines back from
the peer. While both cores share a cache that is cheap; where they do not (cores on different
chiplets, or virtual cores the host moved apart) a 1 MiB plain copy into the area took 415-498
us instead of 61-76, and a two-rank 16 MiB all-reduce ran at 1.6-2.1 GB/s instead of 3.8-11.
Streaming stores (``stream``) took 61-83 us there, but 95-110 while the cache is
shared, where they also cost the peer, who then reads the round from memory; so they are used
only while measured to be much faster (``benchmarks/bench_shm_copies.py`` times each kind).

``AreaWriter.write`` times each large copy. Plain copies are the default; only once
``SLOW_STREAK`` in a row run slower than ``SLOW_BYTES_PER_S`` does the writer try streaming
(building the Numba kernel then, so a fast machine never pays for it). From then on it keeps a
running cost per byte of each kind, uses streaming while plain costs more than
``SWITCH_FACTOR`` times as much, and spends one write in ``EXPLORE_EVERY`` on the other kind to
notice when the machine changes.
``NEURAL_ARCH_SHM_STORES`` = ``plain`` or ``stream`` fixes the choice (``auto`` is the default).
A job where any rank fixes ``stream`` also keeps its broadcast plans, which copy with memcpy
and not through the writer, to ``direct.SMALL_BYTES`` (``collectives.peer_reads_agreed``).
"""
from __future__ import annotations

import os
import time
import warnings
from typing import Any, Callable, Dict, Optional

import numpy as np

from ....backends import numba_backend

ENV_CHOICE = "NEURAL_ARCH_SHM_STORES"
MIN_TIMED_BYTES = 256 << 10  # below this a copy stays in cache and timing it says little
SLOW_BYTES_PER_S = 4e9  # plain copies seen at 9-19 GB/s with a shared cache, 2-2.6 without
SLOW_STREAK = 4  # slow plain copies in a row before streaming is tried (one may be a hiccup)
SWITCH_FACTOR = 2.0
EXPLORE_EVERY = 32
SMOOTHING = 0.25  # weight of the newest cost in the running average

Copy = Callable[[np.ndarray, np.ndarray], None]
_built: Dict[str, Any] = {}  # the checked streaming copy, or why there is none


def streaming_copy() -> Optional[Copy]:
    """The streaming copy, built and checked once, or None (``why_no_streaming()`` says why)."""
    if not numba_backend.is_available():
        return None
    if "copy" not in _built:
        try:
            from .stream import stream_copy
            # compile (or load from Numba's cache) before anything is timed, and check the bytes
            source = np.arange(4096, dtype=np.uint32).view(np.uint8)
            target = np.zeros(source.size + 64, np.uint8)
            stream_copy(target[7:7 + source.size], source)
            if not np.array_equal(target[7:7 + source.size], source):
                raise RuntimeError("the streaming copy changed the bytes it copied")
            _built.update(copy=stream_copy, why="")
        except Exception as exc:  # an LLVM or Numba that cannot build it: copies stay plain
            _built.update(copy=None, why=f"the streaming copy could not be built: {exc!r}")
            warnings.warn(f"{_built['why']}; shared-memory copies stay plain", RuntimeWarning)
    return _built["copy"]


def why_no_streaming() -> str:
    """Why ``streaming_copy()`` returns None ('' when it does not)."""
    return numba_backend.unavailable_reason() or _built.get("why", "")


def _choice() -> str:
    value = os.environ.get(ENV_CHOICE, "auto").strip().lower() or "auto"
    if value not in ("auto", "plain", "stream"):
        raise ValueError(f"{ENV_CHOICE} must be auto, plain or stream, got {value!r}")
    return value


class AreaWriter:
    """One rank's copies into the shared workspace; ``kind`` says which copy it uses now."""

    def __init__(self, choice: Optional[str] = None,
                 clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self.choice = choice if choice is not None else _choice()
        self.clock = clock
        # None: not wanted yet; False: wanted, but there is none (see why_no_streaming)
        self.stream: Any = None
        self.cost: Dict[str, Optional[float]] = {"plain": None, "stream": None}  # ns per byte
        self.writes = self.slow_streak = 0
        if self.choice == "stream":
            self.stream = streaming_copy()
            if self.stream is None:
                raise ValueError(f"{ENV_CHOICE}=stream needs the streaming copy: "
                                 f"{why_no_streaming()}")

    @property
    def kind(self) -> str:
        """The kind of copy large writes use now (one in EXPLORE_EVERY uses the other)."""
        if self.choice != "auto":
            return self.choice
        plain, stream = self.cost["plain"], self.cost["stream"]
        if plain is None or stream is None:
            return "plain"
        return "stream" if plain > SWITCH_FACTOR * stream else "plain"

    def write(self, dst: np.ndarray, src: np.ndarray) -> None:
        """``dst[...] = src`` for contiguous arrays of one dtype and size; ``dst`` lies in the
        workspace and must not overlap ``src``. Copies under MIN_TIMED_BYTES are plain."""
        if src.nbytes < MIN_TIMED_BYTES or self.choice == "plain":
            np.copyto(dst, src)
            return
        if self.choice == "stream":
            self.stream(dst, src)
            return
        kind = self._next_kind()
        start = self.clock()
        if kind == "stream":
            self.stream(dst, src)
        else:
            np.copyto(dst, src)
        cost = (self.clock() - start) / src.nbytes
        old = self.cost[kind]
        self.cost[kind] = cost if old is None else old + SMOOTHING * (cost - old)
        self.writes += 1
        if self.stream is None:
            self.slow_streak = self.slow_streak + 1 if cost > 1e9 / SLOW_BYTES_PER_S else 0
            if self.slow_streak >= SLOW_STREAK:
                self.stream = streaming_copy() or False

    def _next_kind(self) -> str:
        if not self.stream:
            return "plain"
        if self.cost["stream"] is None:
            return "stream"  # plain copies were slow: measure the alternative
        kind = self.kind
        if self.writes % EXPLORE_EVERY == EXPLORE_EVERY - 1:
            return "plain" if kind == "stream" else "stream"
        return kind
