"""``run_in_processes``: run a pickled recipe in N fresh worker processes on this host, through
the project's launcher, and return rank 0's result.

The launcher does what it does for ``python -m neural_arch.distributed.launcher``: a free
rendezvous port on 127.0.0.1, a job secret of its own in NEURAL_ARCH_SECRET (so TCP peers
authenticate as under the launcher), RANK/WORLD_SIZE/LOCAL_RANK/MASTER_ADDR/MASTER_PORT and the
backend in each worker's environment, the output prefixed by rank, and on a failure SIGTERM to
the other workers' process groups, a grace period, then SIGKILL; a guard process stops them
should this process itself be killed. SIGINT (Ctrl-C) stops the workers the same way and is
raised here as KeyboardInterrupt. Results come back through a temporary directory that is
removed afterwards.
"""
from __future__ import annotations

import glob
import json
import os
import pickle
import shutil
import signal
import tempfile
from typing import Any, Dict, Optional

from ...distributed.launch import DistributedLauncher
from ...distributed.launch.workers import describe_exit
from .worker import RESULT_FILE, run_worker

# How often the launcher polls its workers: a failure is seen (and the others stopped) this fast.
_MONITOR_INTERVAL_S = 0.05


def run_in_processes(recipe: bytes, num_processes: int, *, backend: str = "shm",
                     timeout: Optional[float] = None, grace_period: float = 5.0,
                     owner: str = "fit_in_processes") -> Any:
    """Rank 0's return value of the pickled callable ``recipe`` run in ``num_processes``
    workers; RuntimeError naming the rank that failed, how, and what it raised."""
    result_dir = tempfile.mkdtemp(prefix="neural_arch_processes_")
    try:
        launcher = DistributedLauncher(
            run_worker, nproc_per_node=num_processes, backend=backend,
            script_args=(recipe, result_dir), standalone=True, timeout=timeout,
            grace_period=grace_period, monitor_interval=_MONITOR_INTERVAL_S)
        launcher.run()
        kind, rank, code = launcher.outcome
        if kind == "signal" and code == signal.SIGINT:
            raise KeyboardInterrupt(f"{owner}: interrupted; all {num_processes} workers stopped")
        if kind == "signal":
            raise RuntimeError(f"{owner}: received {signal.Signals(code).name}; all "
                               f"{num_processes} workers stopped")
        if kind == "timeout":
            raise RuntimeError(f"{owner}: the {num_processes} workers ran past timeout="
                               f"{timeout} s; all stopped")
        if kind == "failure":
            raise RuntimeError(_failure(owner, num_processes, rank, code, _errors(result_dir)))
        path = os.path.join(result_dir, RESULT_FILE)
        if not os.path.exists(path):
            raise RuntimeError(f"{owner}: all {num_processes} workers exited with code 0 but "
                               f"rank 0 left no result in {path}")
        with open(path, "rb") as handle:
            return pickle.load(handle)
    finally:
        shutil.rmtree(result_dir, ignore_errors=True)


def _errors(result_dir: str) -> Dict[int, Dict[str, Any]]:
    """rank -> {"time", "error"} of every rank that raised."""
    found = {}
    for path in glob.glob(os.path.join(result_dir, "rank*.error.json")):
        try:
            with open(path, encoding="utf-8") as handle:
                record = json.load(handle)
            found[int(record["rank"])] = record
        except (OSError, ValueError, KeyError):
            continue
    return found


def _failure(owner: str, world: int, rank: int, code: int,
             errors: Dict[int, Dict[str, Any]]) -> str:
    """The rank that failed first and how. A rank that died without raising (a signal,
    os._exit) is the cause when the launcher saw it first: its peers' errors follow from it.
    Otherwise the earliest exception is the cause; the launcher may have seen a peer's exit
    first when both ended between two of its polls."""
    how = f" with {describe_exit(code)}"
    if rank in errors:
        first = int(min(errors.values(), key=lambda record: record["time"])["rank"])
        if first != rank:
            rank, how = first, ""  # its exit code is not the one the launcher reported
    message = f"{owner}: rank {rank} of {world} failed{how}"
    if rank in errors:
        message += f": it raised {errors[rank]['error']}"
    others = sorted(r for r in errors if r != rank)
    if others:
        message += (f"; then {', '.join(f'rank {r}' for r in others)} raised "
                    f"{errors[others[0]]['error']}")
    return message + "; the other workers were stopped (their output is above, prefixed [rank N])"
