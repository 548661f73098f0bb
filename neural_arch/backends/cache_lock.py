"""Lock files that several processes (and threads) take around their steps on one Numba cache.

``compiled_cache`` holds them while it flushes a group's cache and records the digest of its
sources, and while a guarded dispatcher loads or saves an entry, so that a save checked against
the old digest cannot land between another process's flush and its record. ``fcntl.flock``
locks the open file, so the kernel drops the lock of a process that dies holding it. A thread
that already holds a lock file takes it again at once (Numba may compile, and so load, while a
refresh holds it). Where ``fcntl`` is missing (Windows) or a lock file cannot be opened (a
folder this process may not write, so it writes nothing there either) the steps run unlocked.
"""
from __future__ import annotations

import contextlib
import threading
import time
from typing import IO, Iterator, List, Optional, Sequence, Tuple

try:
    import fcntl
except ImportError:  # not POSIX
    fcntl = None  # type: ignore[assignment]

TIMEOUT_S = 10.0  # the steps under a lock take milliseconds; a holder this slow is not waited on

_held = threading.local()  # .paths: the lock files this thread holds


def _acquire(path: str, deadline: float) -> Tuple[bool, Optional[IO]]:
    """(got it, the open lock file or None where it runs unlocked) for the lock file ``path``,
    waited for until ``deadline`` (``time.monotonic``)."""
    if fcntl is None:
        return True, None
    try:
        handle = open(path, "a")
    except OSError:
        return True, None
    pause = 0.001
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True, handle
        except BlockingIOError:
            if time.monotonic() >= deadline:
                handle.close()
                return False, None
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        except OSError:  # a file system without flock
            handle.close()
            return True, None


@contextlib.contextmanager
def locked(paths: Sequence[str]) -> Iterator[bool]:
    """Hold the lock files ``paths`` (created where missing; always taken in sorted order, so
    two holders of overlapping sets cannot deadlock) for the ``with`` block. Yields False when
    one was not got within ``TIMEOUT_S`` seconds: the caller then skips what needed it."""
    held = getattr(_held, "paths", None)
    if held is None:
        held = _held.paths = set()
    taken: List[Tuple[str, IO]] = []
    got = True
    deadline = time.monotonic() + TIMEOUT_S
    try:
        for path in sorted(set(paths) - held):
            got, handle = _acquire(path, deadline)
            if not got:
                break
            if handle is not None:
                taken.append((path, handle))
                held.add(path)
        yield got
    finally:
        for path, handle in reversed(taken):
            held.discard(path)
            handle.close()  # closing the file drops its lock


__all__ = ["TIMEOUT_S", "locked"]
