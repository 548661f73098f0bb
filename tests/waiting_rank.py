"""One rank of a small job, started on its own, whose output lines are timed as they arrive.

Run as a script, it joins a job (``env://`` from RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT,
or ``tcp://host:port RANK WORLD_SIZE`` as ``train_gpt --rank`` does), all-reduces a vector of
ones and prints ``sum <value>``. ``WaitingRank`` starts it and records every line of its
stderr and stdout with the seconds since the start, so a test can ask when the rank first said
that it waits, and how it ended. The rendezvous tests (``tests/faults/test_silent_waits.py``)
and the fault report's rendezvous row (``scripts/fault_rows_rendezvous.py``) share it.
"""
from __future__ import annotations

import os
import re
import secrets
import subprocess
import sys
import threading
import time
from typing import Optional

# Short settings, so that a wait that would last minutes ends within a test's time.
TIMEOUT_S = 12.0
REPORT_S = 2.0
WAITING = re.compile(r"is waiting")


def job_env(world_size: int, port: int, secret: Optional[str] = None,
            timeout_s: float = TIMEOUT_S, report_s: float = REPORT_S) -> dict:
    """The environment of one job's ranks (but RANK): its master, secret and short waits."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_"))}
    env.update({"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "NEURAL_ARCH_SECRET": secret or secrets.token_hex(16),
                "NEURAL_ARCH_RENDEZVOUS_TIMEOUT": str(timeout_s),
                "NEURAL_ARCH_RENDEZVOUS_REPORT": str(report_s)})
    return env


class WaitingRank:
    """A rank process with its output lines timed (seconds since it started)."""

    def __init__(self, env: dict, rank: int, *args: str) -> None:
        self.rank = rank
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.started = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                                     env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     start_new_session=True)
        self._readers = [threading.Thread(target=self._read, args=(stream,), daemon=True)
                         for stream in (self.proc.stdout, self.proc.stderr)]
        for reader in self._readers:
            reader.start()
        self.ended: Optional[float] = None

    def _read(self, stream) -> None:
        for raw in iter(stream.readline, b""):
            with self._lock:
                self.lines.append((time.monotonic() - self.started,
                                   raw.decode(errors="replace").rstrip("\n")))
        stream.close()

    def first(self, pattern: re.Pattern = WAITING) -> Optional[tuple[float, str]]:
        """(seconds, line) of the first line matching ``pattern``, or None."""
        with self._lock:
            return next(((t, line) for t, line in self.lines if pattern.search(line)), None)

    def wait_for_line(self, pattern: re.Pattern, limit: float) -> Optional[tuple[float, str]]:
        deadline = time.monotonic() + limit
        while time.monotonic() < deadline and self.proc.poll() is None:
            found = self.first(pattern)
            if found:
                return found
            time.sleep(0.05)
        return self.first(pattern)

    def finish(self, limit: float) -> Optional[int]:
        """The exit code once the rank ended within ``limit`` s, or None (it is killed then)."""
        try:
            code = self.proc.wait(limit)
            self.ended = time.monotonic() - self.started
        except subprocess.TimeoutExpired:
            code = None
        self.stop()
        return code

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        for reader in self._readers:
            reader.join(5)

    def text(self) -> str:
        with self._lock:
            return "\n".join(f"{t:7.2f} {line}" for t, line in self.lines)


def main(argv: list[str]) -> int:
    import numpy as np

    from neural_arch import distributed as dist
    if argv and argv[0].startswith("tcp://"):
        dist.init_process_group("tcp", init_method=argv[0], rank=int(argv[1]),
                                world_size=int(argv[2]))
    else:
        dist.init_process_group("tcp")
    ones = np.ones(4)
    dist.all_reduce(ones)
    print(f"sum {ones[0]:g}", flush=True)  # each element: the world size
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
