"""POSIX shared-memory segments: create, attach and unlink, with cleanup at exit and on SIGTERM.

The registry of names this process created and has not unlinked yet, and the SIGTERM handler it
installs, live only here: other modules call these functions and never copy that state.
"""
from __future__ import annotations

import atexit
import mmap
import os
import signal
import threading

import _posixshmem

from ...errors import RendezvousError

# Names this process created and has not unlinked yet. While there are any, an atexit hook and
# a SIGTERM handler (chained to the previous one) unlink them; once all ranks have mapped a
# segment its name is unlinked and the handler is put back.
_pending: set = set()
_previous_sigterm: list = []


def unlink_segment(name: str) -> None:
    _pending.discard(name)
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass
    if not _pending and _previous_sigterm and \
            threading.current_thread() is threading.main_thread() and \
            signal.getsignal(signal.SIGTERM) is _unlink_on_sigterm:
        signal.signal(signal.SIGTERM, _previous_sigterm.pop())


def _unlink_pending() -> None:
    for name in list(_pending):
        unlink_segment(name)


def _unlink_on_sigterm(signum, frame) -> None:
    previous = _previous_sigterm[-1] if _previous_sigterm else signal.SIG_DFL
    _unlink_pending()
    if callable(previous):
        previous(signum, frame)
    elif previous != signal.SIG_IGN:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)


def _track(name: str) -> None:
    if not _pending:
        atexit.unregister(_unlink_pending)
        atexit.register(_unlink_pending)
        if threading.current_thread() is threading.main_thread() and \
                signal.getsignal(signal.SIGTERM) is not _unlink_on_sigterm:
            _previous_sigterm[:] = [signal.getsignal(signal.SIGTERM)]
            signal.signal(signal.SIGTERM, _unlink_on_sigterm)
    _pending.add(name)


def create_segment(name: str, size: int) -> mmap.mmap:
    fd = _posixshmem.shm_open("/" + name, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode=0o600)
    try:
        _track(name)
        os.ftruncate(fd, size)
        return mmap.mmap(fd, size)
    except BaseException:
        unlink_segment(name)
        raise
    finally:
        os.close(fd)


def attach_segment(name: str, size: int, rank: int) -> mmap.mmap:
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
    except FileNotFoundError:
        raise RendezvousError(f"shared-memory segment {name} does not exist: its creator exited "
                              "or this job's ranks already joined without this rank",
                              rank=rank) from None
    try:
        actual = os.fstat(fd).st_size
        if actual != size:
            raise RendezvousError(f"shared-memory segment {name} has {actual} bytes, expected "
                                  f"{size}", rank=rank)
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
