"""Which process writes a temporary checkpoint directory, and whether it still runs.

A writer records itself in the temporary directory's name (``format``), so the record exists
from the moment the directory does: a key of its process table, its pid and its start time.
The key hashes the hostname, the boot id and the pid namespace, so two processes have the same
key exactly when each can see the other's pid. The start time (clock ticks after boot, from
/proc) tells the writer apart from a later process that was given the same pid.

A writer with another key runs on another host or in another container: whether it still runs
cannot be known from here, so its directories are left alone.
"""
from __future__ import annotations

import hashlib
import os
import re
import socket
from dataclasses import dataclass
from typing import Optional

RUNNING, GONE, UNKNOWN = "running", "gone", "unknown"
PATTERN = r"[0-9a-f]{16}-\d+-\d+"  # how ``str(Writer)`` looks inside a directory name
_PARSE = re.compile(r"^([0-9a-f]{16})-(\d+)-(\d+)$")


@dataclass(frozen=True)
class Writer:
    host: str  # 16 hex digits: the process table the pid belongs to
    pid: int
    start: int  # 0 where the system does not tell process start times

    def __str__(self) -> str:
        return f"{self.host}-{self.pid}-{self.start}"

    @classmethod
    def parse(cls, text: str) -> "Writer":
        match = _PARSE.match(text)
        if match is None:
            raise ValueError(f"not a checkpoint writer record: {text!r}")
        return cls(match.group(1), int(match.group(2)), int(match.group(3)))


def _host_key() -> str:
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(str(os.stat("/proc/self/ns/pid").st_ino))
    except OSError:
        pass  # not Linux: the hostname alone has to do
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _process_stat(pid: int) -> Optional[tuple]:
    """(state letter, start time) of ``pid`` from /proc, or None when it does not exist."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name may hold spaces and parentheses: fields follow the last ')'.
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def this_process() -> Writer:
    """The record of the calling process (computed each time: a forked child has a new pid)."""
    pid = os.getpid()
    stat = _process_stat(pid)
    return Writer(_host_key(), pid, 0 if stat is None else stat[1])


def state(writer: Writer) -> str:
    """RUNNING, GONE, or UNKNOWN (the writer is in another process table)."""
    if writer.host != _host_key():
        return UNKNOWN
    if os.path.isdir("/proc"):
        stat = _process_stat(writer.pid)
        if stat is None or stat[0] in (b"Z", b"X", b"x"):  # a zombie has stopped writing
            return GONE
        return RUNNING if writer.start in (0, stat[1]) else GONE
    try:
        os.kill(writer.pid, 0)
    except ProcessLookupError:
        return GONE
    except PermissionError:
        pass  # it exists, owned by another user
    return RUNNING
