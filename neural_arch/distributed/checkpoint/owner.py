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
from dataclasses import dataclass

from ..processes import host_identity, process_alive, process_stat

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
    """16 hex digits, equal for processes that see each other's pids."""
    return hashlib.sha256(host_identity("pid").encode()).hexdigest()[:16]


def this_process() -> Writer:
    """The record of the calling process (computed each time: a forked child has a new pid)."""
    pid = os.getpid()
    stat = process_stat(pid)
    return Writer(_host_key(), pid, 0 if stat is None else stat[1])


def state(writer: Writer) -> str:
    """RUNNING, GONE, or UNKNOWN (the writer is in another process table)."""
    if writer.host != _host_key():
        return UNKNOWN
    return RUNNING if process_alive(writer.pid, writer.start) else GONE
