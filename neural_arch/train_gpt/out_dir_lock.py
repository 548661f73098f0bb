"""One training run per ``--out-dir``: a lock file that the run's rank 0 holds while it trains.

Two runs writing one output directory interleave their ``metrics.jsonl`` lines and overwrite
each other's checkpoints; the second is therefore refused at once, told which process holds
the directory. The lock is ``fcntl.flock`` on ``<out-dir>/train.lock``: the kernel releases it
when its holder ends, however it ends, so a run killed with SIGKILL leaves a file that blocks
nobody. The file records the holder's host and pid (for the refusal's message only; the lock
itself is the flock). A run that ends normally removes it.
"""
from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from typing import Optional

from .args import UsageError

LOCK_FILE = "train.lock"
HOLDER_WRITE_WAIT_S = 1.0  # a holder writes its host and pid right after taking the lock
_OPEN_ATTEMPTS = 5


class OutDirLock:
    """``acquire()`` creates ``out_dir`` if needed and takes its lock, or raises UsageError
    naming the holder; ``release()`` removes the file and lets go."""

    def __init__(self, out_dir: str) -> None:
        self.out_dir = out_dir
        self.path = os.path.join(out_dir, LOCK_FILE)
        self._fd: Optional[int] = None

    def acquire(self) -> "OutDirLock":
        try:
            os.makedirs(self.out_dir, exist_ok=True)
        except OSError as exc:
            raise UsageError(f"--out-dir {self.out_dir} cannot be created: "
                             f"{exc.strerror or exc}") from None
        for _ in range(_OPEN_ATTEMPTS):
            try:
                fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            except OSError as exc:
                raise UsageError(f"--out-dir {self.out_dir}: cannot create the lock file "
                                 f"{self.path}: {exc.strerror or exc}") from None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = _holder(fd)
                os.close(fd)
                raise UsageError(f"--out-dir {self.out_dir} is in use by another run "
                                 f"({holder or 'its host and pid not recorded'}, holding "
                                 f"{self.path}); wait for it to end or choose another "
                                 f"--out-dir") from None
            except OSError as exc:  # a file system without locks, say
                os.close(fd)
                raise UsageError(f"--out-dir {self.out_dir}: cannot lock {self.path}: "
                                 f"{exc.strerror or exc}") from None
            # The last holder removes the file when it ends: a file opened just before that
            # is no longer the lock file, so its lock guards nothing. Open the path again.
            if _same_file(fd, self.path):
                os.ftruncate(fd, 0)
                os.write(fd, json.dumps({"host": socket.gethostname(),
                                         "pid": os.getpid()}).encode())
                self._fd = fd
                return self
            os.close(fd)
        raise UsageError(f"--out-dir {self.out_dir}: {self.path} was replaced "
                         f"{_OPEN_ATTEMPTS} times while being locked; another program keeps "
                         f"rewriting it")

    def release(self) -> None:
        if self._fd is None:
            return
        try:
            if _same_file(self._fd, self.path):
                os.unlink(self.path)  # before letting go: nobody locks a file on its way out
        except OSError:
            pass  # the directory went away or became read-only: the flock still ends below
        os.close(self._fd)
        self._fd = None


def _same_file(fd: int, path: str) -> bool:
    try:
        here, there = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def _holder(fd: int) -> Optional[str]:
    """``host H, pid P`` from the lock file, waiting briefly for a holder that has just taken
    the lock and not yet written it; None when it stays unreadable."""
    deadline = time.monotonic() + HOLDER_WRITE_WAIT_S
    while True:
        try:
            record = json.loads(os.pread(fd, 4096, 0).decode("utf-8"))
            return f"host {record['host']}, pid {int(record['pid'])}"
        except (OSError, ValueError, KeyError, TypeError):
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)


__all__ = ["LOCK_FILE", "OutDirLock"]
