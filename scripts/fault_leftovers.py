"""What one run of a fault left behind: processes still running and /dev/shm segments.

While a run lasts, the environment carries a mark of its own (``NF_FAULT_RUN``), which every
process it starts inherits, however it was started and whoever adopted it since. Afterwards,
and after a short settling time, the run has left behind

* every live process carrying the mark, other than this process's own children (its helpers,
  such as a fork server kept for later runs; the runners reap the children they start), and
  every live one of the pids the runner reported;
* every shared-memory segment (``/dev/shm/nf_<creator pid>_...``) that appeared during the run
  and whose creator is one of those processes or no longer runs: nobody will remove it.

Both are then removed, so that the next run starts clean. A segment that another job on the
machine leaks during the run would be counted too: measure on a quiet machine.
"""
from __future__ import annotations

import os
import secrets
import signal
import time
from pathlib import Path
from typing import Iterable, List, Set

MARK = "NF_FAULT_RUN"
SHM = Path("/dev/shm")
SETTLE_S = 3.0


def _stat(pid: int) -> List[str]:
    """State, ppid, ... of a process ([] once it is gone)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def _describe(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"pid {pid}"
    words = [os.path.basename(a.decode(errors="replace")) for a in argv if a]
    # The program and its first argument that is not an option: "python fault_injection_job.py"
    named = words[:1] + [w for w in words[1:] if not w.startswith("-")][:1]
    return f"pid {pid} ({' '.join(named)})"


def _segments() -> Set[str]:
    try:
        return {n for n in os.listdir(SHM) if n.startswith("nf_")}
    except OSError:
        return set()


def _creator(name: str) -> int:
    part = name.split("_")[1] if name.count("_") >= 2 else ""
    return int(part) if part.isdigit() else -1


class Leftovers:
    """``with Leftovers() as run: ...`` then ``run.collect(pids)``: descriptions, [] if none."""

    def __enter__(self) -> "Leftovers":
        self.mark = secrets.token_hex(8)
        self._before = _segments()
        self._saved = os.environ.get(MARK)
        os.environ[MARK] = self.mark
        return self

    def __exit__(self, *exc_info) -> None:
        if self._saved is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = self._saved

    def _marked(self) -> Set[int]:
        wanted, me, found = f"{MARK}={self.mark}".encode(), os.getpid(), set()
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) == me:
                continue
            fields = _stat(int(entry))
            if not fields or fields[0] in ("Z", "X") or int(fields[1]) == me:
                continue
            try:
                environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            except OSError:
                continue
            if wanted in environ:
                found.add(int(entry))
        return found

    def collect(self, pids: Iterable[int] = ()) -> List[str]:
        """Wait a little for the run's processes to end; then report and remove what is left."""
        pids = set(pids)
        deadline = time.monotonic() + SETTLE_S
        while True:
            running = self._marked() | {p for p in pids if alive(p)}
            if not running or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        left = [_describe(p) for p in sorted(running)]
        for pid in running:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        # SIGKILL is delivered asynchronously: the next run starts once these are gone.
        gone_by = time.monotonic() + SETTLE_S
        while any(alive(p) for p in running) and time.monotonic() < gone_by:
            time.sleep(0.01)
        ours = pids | running
        for name in sorted(_segments() - self._before):
            creator = _creator(name)
            if creator in ours or not alive(creator):
                left.append(f"segment {name}")
                try:
                    os.unlink(SHM / name)
                except FileNotFoundError:
                    pass
        return left
