"""Which processes can see each other, and whether a process still runs: read from /proc.

Three parts of the framework ask: the MPI transport watches same-host peers by pid, the
backend choice asks whether every rank can share memory segments, and checkpoints ask whether
the writer of a temporary directory is gone. A pid alone is not a process: pids are reused, so
a process is a pid together with its start time (field 22 of ``/proc/<pid>/stat``, in clock
ticks since boot), and it only means something within one host and one pid namespace.
"""
from __future__ import annotations

import os
import socket
from typing import Optional, Tuple

__all__ = ["host_identity", "process_alive", "process_stat"]


def host_identity(namespace: str = "pid") -> str:
    """Hostname, boot id and the inode of this process's ``namespace`` (``pid``: processes that
    see each other's pids; ``ipc``: processes that can share memory segments). Equal for two
    processes exactly when they share that namespace of one booted host; the hostname alone
    where the system tells nothing more."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(str(os.stat(f"/proc/self/ns/{namespace}").st_ino))
    except OSError:
        pass  # not Linux
    return "|".join(parts)


def process_stat(pid: int) -> Optional[Tuple[bytes, int]]:
    """(state letter, start time) of ``pid``, or None when there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            # The command name may hold spaces and parentheses: the fields follow the last ')'.
            fields = f.read().rsplit(b")", 1)[1].split()
        return fields[0], int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def process_alive(pid: int, start_time: int = 0) -> bool:
    """Whether ``pid`` still runs the process started at ``start_time`` (0: not known). A
    zombie has stopped running; without /proc, any process with that pid counts."""
    if os.path.isdir("/proc"):
        stat = process_stat(pid)
        if stat is None or stat[0] in (b"Z", b"X", b"x"):
            return False
        return start_time in (0, stat[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # it exists, owned by another user
    return True
