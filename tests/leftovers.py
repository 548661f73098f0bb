"""What a finished job must not leave behind: processes, and shared-memory segments.

The shared-memory transport names its segments ``nf_<creator pid>_<random>`` in /dev/shm, so a
segment is attributed to the job whose process created it; other jobs running on the same host
at the same time are never mistaken for ours.

``Leftovers`` watches the processes started below this one while a test runs (every
``period`` seconds, plus any pids the test names) and, at the end, lists those still alive and
the segments any of them created. ``tests/faults/conftest.py`` wraps it in the ``leftovers``
fixture, which fails a test that leaves anything and then removes what it left, so that one
failure does not spill into the next test.
"""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Iterable

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "nf_"
# Helpers that outlive a test by design: the forkserver the rank harness starts once, and the
# resource tracker of multiprocessing.
_LONG_LIVED = (b"forkserver", b"resource_tracker")


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in (b"Z", b"X")


def segments_of(pids: Iterable[int]) -> list[str]:
    """Our segments in /dev/shm created by any of ``pids``."""
    prefixes = tuple(f"{SEGMENT_PREFIX}{pid}_" for pid in pids)
    if not prefixes:
        return []
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return []
    return sorted(n for n in names if n.startswith(prefixes))


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process on the host."""
    parents = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat", "rb") as f:
                    parents[int(entry)] = int(f.read().rsplit(b")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                pass
    return parents


def descendants(root: int) -> set[int]:
    """Every live process below ``root`` (children, grandchildren, ...)."""
    children: dict[int, list[int]] = {}
    for pid, parent in _parents().items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return {pid for pid in found if alive(pid)}


def _long_lived(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            command = f.read()
    except OSError:
        return False
    return any(word in command for word in _LONG_LIVED)


def wait_gone(pids: Iterable[int], limit: float) -> list[int]:
    """Wait up to ``limit`` seconds for ``pids`` to end; the ones still alive."""
    pids = list(pids)
    deadline = time.monotonic() + limit
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(p for p in pids if alive(p))


class Leftovers:
    """The processes a test starts, and what they leave once it is over."""

    def __init__(self, period: float = 0.2) -> None:
        self._root = os.getpid()
        self._before = descendants(self._root)
        self._seen: set[int] = set()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._period = period
        self._thread = threading.Thread(target=self._watch, name="leftovers-watch", daemon=True)
        self._thread.start()

    def add(self, pids: Iterable[int]) -> None:
        """Processes the test started some other way (in another session, say): watch them too."""
        with self._lock:
            self._seen.update(int(p) for p in pids if p)

    def _watch(self) -> None:
        while True:
            self._look()
            if self._stop.wait(self._period):
                return

    def _look(self) -> None:
        new = {p for p in descendants(self._root) - self._before if not _long_lived(p)}
        with self._lock:
            self._seen |= new

    def check(self, limit: float = 5.0) -> tuple[list[int], list[str]]:
        """Stop watching; after waiting up to ``limit`` seconds for the test's processes to end,
        return (pids still alive, segments any of them created that still exist)."""
        self._look()
        self._stop.set()
        self._thread.join()
        with self._lock:
            seen = set(self._seen)
        left = wait_gone(seen, limit)
        deadline = time.monotonic() + limit
        while segments_of(seen) and time.monotonic() < deadline:  # being unlinked just now
            time.sleep(0.05)
        return left, segments_of(seen)

    def remove(self, pids: Iterable[int], segments: Iterable[str]) -> None:
        """Kill ``pids`` and unlink ``segments``: what a failed check found."""
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # also ends a stopped process
            except OSError:
                pass
        for name in segments:
            try:
                os.unlink(os.path.join(SHM_DIR, name))
            except OSError:
                pass
