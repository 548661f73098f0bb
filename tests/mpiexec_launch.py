"""A job under ``mpiexec`` tried again when Open MPI's own launcher did not start.

On a loaded machine ``mpiexec`` sometimes fails before it starts any rank: its PMIx server's
listener thread does not come up, it prints ``START_FAILURE`` and exits. No rank ran, so
running the job again tests the same thing. Every test that starts ``mpiexec`` runs its launch
through ``run_until_launched`` (``start_until_launched`` for a job left running); only that
message, with no rank having left a trace, starts a job again: any other outcome, a rank's
failure included, is the caller's to judge.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Callable, TypeVar

START_FAILURE = "The PMIx server's listener thread failed to start"
START_ATTEMPTS = 3

Result = TypeVar("Result")


def launcher_failed(output) -> bool:
    """Whether ``output`` (text or bytes: what ``mpiexec`` printed) says its own launcher
    did not start."""
    if isinstance(output, bytes):
        output = output.decode(errors="replace")
    return START_FAILURE in (output or "")


def run_until_launched(run_once: Callable[[], Result],
                       output_of: Callable[[Result], object] = lambda result: result,
                       attempts: int = START_ATTEMPTS) -> Result:
    """``run_once()``, run again (``attempts`` runs at most) while ``mpiexec``'s own launcher
    did not start. ``output_of(result)`` is what the run printed, or ``""`` where a rank left
    a trace (then the run counts whatever it printed). An exception from ``run_once`` is run
    again only when its text carries the launcher's message (a harness's error holding the
    job's output); any other is raised at once."""
    for attempt in range(1, attempts + 1):
        try:
            result = run_once()
        except Exception as exc:
            if attempt == attempts or not launcher_failed(str(exc)):
                raise
            continue
        if attempt == attempts or not launcher_failed(output_of(result)):
            return result
    raise AssertionError("unreachable: the last attempt returns or raises")


def start_until_launched(start: Callable[[], subprocess.Popen], ran: Callable[[], bool],
                         log_path: Path, limit: float) -> subprocess.Popen:
    """A job left running: ``start()`` (``mpiexec``, printing to ``log_path``), waited for
    until ``ran()`` (a rank left its trace) or the job ended, ``limit`` seconds at most; started
    again while it ended with no rank run and the launcher's message in its log."""
    def start_once() -> subprocess.Popen:
        job, deadline = start(), time.monotonic() + limit
        while job.poll() is None and not ran() and time.monotonic() < deadline:
            time.sleep(0.05)
        return job

    def output_of(job: subprocess.Popen) -> str:
        if job.poll() is None or ran():
            return ""
        return Path(log_path).read_text(errors="replace")
    return run_until_launched(start_once, output_of)
