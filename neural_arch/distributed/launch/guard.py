"""Workers never outlive their launcher, even one killed with SIGKILL.

A launcher that is alive stops its workers itself (SIGTERM to each worker's process group, the
grace period, then SIGKILL). When the launcher is killed outright (``kill -9``, the OOM killer)
two mechanisms stand in for it:

* ``die_with_launcher``: on Linux each worker asks the kernel, between fork and exec, for
  SIGTERM when its parent dies (``prctl(PR_SET_PDEATHSIG)``). SIGTERM rather than SIGKILL, so
  that the worker's own handlers and exit hooks run: the shared-memory transport unlinks a
  segment whose name is still in /dev/shm. The request can only watch a parent that is still
  there, so the child then checks that the launcher did not die before it was made.
* The guard, a small process of its own (``python guard.py LAUNCHER_PID GRACE``) that the
  launcher tells about each worker's process group over a pipe. The pipe reaches end of file
  when the launcher exits or dies; the guard then stops every group that still has live
  members the way the launcher would have: SIGTERM, the grace period, SIGKILL. It reaches what
  the death signal does not: a worker's own children, a worker that catches or ignores
  SIGTERM (a collective that waits for a peer which will never come), and systems without
  ``prctl``. It runs in its own session, so the signals of the launcher's terminal or process
  group do not stop it with the launcher.

This module imports nothing but the standard library: the guard runs it as a file, so that it
starts in milliseconds without loading the framework.
"""
from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from typing import Callable, Iterable, Optional, Set

__all__ = ["LauncherGuard", "die_with_launcher", "live_groups"]

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>
_POLL_S = 0.5  # how often the guard also checks its parent pid (see ``_watch``)


def live_groups(pgids: Iterable[int]) -> Set[int]:
    """Those of ``pgids`` whose process group still has a member that is not a zombie.

    Orphaned processes may stay zombies for a long time when the init process does not reap
    them, and ``killpg(pgid, 0)`` would count those as alive.
    """
    wanted = set(pgids)
    if not wanted:
        return set()
    try:
        entries = os.listdir("/proc")
    except OSError:  # no procfs: zombies count as alive, which only lengthens the grace wait
        found = set()
        for pgid in wanted:
            try:
                os.killpg(pgid, 0)
                found.add(pgid)
            except (ProcessLookupError, PermissionError):
                pass
        return found
    found = set()
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                # Fields after the parenthesised command: state, ppid, pgrp, ...
                fields = stat.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue  # exited while we looked
        if int(fields[2]) in wanted and fields[0] not in (b"Z", b"X"):
            found.add(int(fields[2]))
    return found


# ----- in the worker, between fork and exec ---------------------------------------------------
def _load_prctl() -> Optional[Callable[..., int]]:
    if not sys.platform.startswith("linux"):
        return None
    import ctypes
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int] + [ctypes.c_ulong] * 4
    prctl.restype = ctypes.c_int
    return prctl


def die_with_launcher(launcher_pid: Optional[int] = None) -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` that makes the child get SIGTERM when its launcher dies; None without
    ``prctl`` (the guard alone then stands in for a dead launcher).

    ``launcher_pid`` is the process that will fork the child (default: this one). The death
    signal fires when the *thread* that forked the child ends, so the launcher starts its
    workers from the thread that then waits for them.
    """
    prctl = _load_prctl()  # loaded here, in the parent: the child only calls it
    if prctl is None:
        return None
    parent = os.getpid() if launcher_pid is None else launcher_pid
    term = int(signal.SIGTERM)

    def request() -> None:
        prctl(_PR_SET_PDEATHSIG, term, 0, 0, 0)
        # A launcher that died before the request was made can no longer send it: the child
        # has been adopted by another process already. Leave as the signal would have made us.
        if os.getppid() != parent:
            os._exit(128 + term)

    return request


# ----- in the launcher ------------------------------------------------------------------------
class LauncherGuard:
    """The launcher's end of the guard: start it, tell it each worker group to watch, close it.

    Messages are lines on the guard's stdin: ``+PGID`` to watch a group, ``-PGID`` once the
    launcher has seen the group empty (its id may then be reused by an unrelated process).
    A guard that died is simply not told any more: the death signal still covers the workers.
    """

    def __init__(self, grace_period: float) -> None:
        # -I -S: the standard library only, no site packages, nothing from the environment.
        self.proc = subprocess.Popen(
            [sys.executable, "-I", "-S", os.path.abspath(__file__), str(os.getpid()),
             repr(float(grace_period))],
            stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, start_new_session=True)

    def _send(self, line: str) -> None:
        try:
            self.proc.stdin.write(line.encode() + b"\n")
            self.proc.stdin.flush()
        except (OSError, ValueError):
            pass

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def forget(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self, wait: float = 2.0) -> None:
        """End of file for the guard: it stops what is left of the groups it watches, exits."""
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=wait)
        except subprocess.TimeoutExpired:
            pass  # still stopping a stubborn group; it exits on its own after the grace period


# ----- the guard process ----------------------------------------------------------------------
def _watch(launcher_pid: int) -> Set[int]:
    """Read the launcher's messages until it is gone; the groups then still watched."""
    groups: Set[int] = set()
    pending = b""
    fd = sys.stdin.fileno()
    while True:
        ready, _, _ = select.select([fd], [], [], _POLL_S)
        if not ready:
            # End of file comes when the launcher dies, unless a process it forked inherited
            # the pipe; a new parent (the launcher's pid gone) tells the same, a little later.
            if os.getppid() != launcher_pid:
                return groups
            continue
        chunk = os.read(fd, 4096)
        if not chunk:
            return groups
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            if line[:1] == b"+":
                groups.add(int(line[1:]))
            elif line[:1] == b"-":
                groups.discard(int(line[1:]))


def _signal_groups(pgids: Iterable[int], signum: int) -> None:
    for pgid in pgids:
        try:
            os.killpg(pgid, signum)
        except (ProcessLookupError, PermissionError):
            pass


def stop_groups(pgids: Iterable[int], grace_period: float, launcher_pid: int) -> None:
    """SIGTERM every live group, wait up to ``grace_period``, SIGKILL what is left."""
    live = live_groups(pgids)
    if not live:
        return
    try:
        sys.stderr.write(f"launcher: the launcher (pid {launcher_pid}) ended with workers still "
                         f"running; stopping their process groups {sorted(live)}: SIGTERM, then "
                         f"SIGKILL after {grace_period:g} s\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # nobody reads the launcher's console any more
    _signal_groups(live, signal.SIGTERM)
    give_up = time.monotonic() + grace_period
    while live and time.monotonic() < give_up:
        time.sleep(0.05)
        live = live_groups(live)
    _signal_groups(live, signal.SIGKILL)


def main(argv: Optional[list] = None) -> int:
    launcher_pid, grace_period = (argv if argv is not None else sys.argv[1:])
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the launcher's end decides
    stop_groups(_watch(int(launcher_pid)), float(grace_period), int(launcher_pid))
    return 0


if __name__ == "__main__":
    sys.exit(main())
