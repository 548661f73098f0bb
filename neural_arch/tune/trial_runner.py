"""One trial's processes, seen from the tuner: started, read, stopped, concluded.

A trial is a job of ``processes`` ranks started through the project's launcher in a thread of
the tuner (``DistributedLauncher``: rendezvous on a free port, each rank its own process group,
a guard process that stops them should the tuner die). ``stop()`` asks the launcher to end
the trial now, as a signal would: SIGTERM to every rank's process group, a grace period, then
SIGKILL, and the thread returns once they are gone. The tuner reads the trial's reports from
``reports.jsonl`` between its polls (``new_reports``) and, when the thread is done, how it
ended (``outcome``).
"""
from __future__ import annotations

import glob
import json
import os
import pickle
import threading
import time
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, Tuple

from ..distributed.launch import DistributedLauncher
from ..distributed.launch.workers import describe_exit
from ..training.launching.worker import RESULT_FILE, run_worker
from .reports import ReportReader
from .trial_worker import log_path

MONITOR_INTERVAL_S = 0.05  # the launcher's polls: a failed or stopped rank is seen this fast


class Outcome(NamedTuple):
    kind: str                # "success", "failure", "timeout" or "stopped"
    result: Any = None       # rank 0's return value of train_fn (success)
    error: Optional[str] = None


class RunningTrial:
    def __init__(self, trial: Any, config: Dict[str, Any], directory: str, payload: bytes,
                 processes: int, backend: str, env: Mapping[str, str], slot: int,
                 timeout: Optional[float] = None, grace_period: float = 3.0) -> None:
        self.trial, self.config, self.directory, self.slot = trial, config, directory, slot
        self.processes = processes
        self.started = time.monotonic()
        self.pruned_at: Optional[int] = None
        self._reports = ReportReader(directory)
        self._error: Optional[BaseException] = None
        self._launcher = DistributedLauncher(
            run_worker, nproc_per_node=processes, backend=backend, script_args=(payload,
                                                                               directory),
            standalone=True, env=dict(env), timeout=timeout, grace_period=grace_period,
            monitor_interval=MONITOR_INTERVAL_S, prefix_output=False,
            announce_end=False)  # the tuner says how each trial ended, naming its logs
        self._thread = threading.Thread(target=self._run, name=f"tune-trial-{trial.number}",
                                        daemon=True)
        self._thread.start()

    @property
    def number(self) -> int:
        return self.trial.number

    def _run(self) -> None:
        try:
            self._launcher.run()
        except BaseException as exc:  # a launch error: the trial fails with it
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def stop(self) -> None:
        self._launcher.stop()

    def join(self, timeout: float) -> bool:
        self._thread.join(timeout)
        return self.done()

    @property
    def last_values(self) -> Dict[str, Optional[float]]:
        return self._reports.last_values

    def new_reports(self) -> List[Tuple[int, Dict[str, Optional[float]]]]:
        """(step, values) of the whole lines rank 0 appended since the last call."""
        return self._reports.new_reports()

    def outcome(self) -> Outcome:
        if self.pruned_at is not None:
            return Outcome("stopped")
        if self._error is not None:
            return Outcome("failure", error=f"the trial's processes could not start: "
                                            f"{type(self._error).__name__}: {self._error}")
        kind, rank, code = self._launcher.outcome
        if kind == "success":
            path = os.path.join(self.directory, RESULT_FILE)
            if not os.path.exists(path):
                return Outcome("failure", error=f"rank 0 exited with code 0 but left no "
                                                f"result in {path}")
            with open(path, "rb") as handle:
                return Outcome("success", pickle.load(handle))
        if kind == "timeout":
            return Outcome("timeout", error=f"the trial ran past trial_timeout="
                                            f"{self._launcher.config.timeout} s; its "
                                            f"{self.processes} processes were stopped")
        return Outcome("failure", error=self._failure(rank, code))

    def _failure(self, rank: int, code: int) -> str:
        """The first rank that raised, and what (from its error file), else how it ended."""
        records = []
        for path in glob.glob(os.path.join(self.directory, "rank*.error.json")):
            try:
                with open(path, encoding="utf-8") as handle:
                    records.append(json.load(handle))
            except (OSError, ValueError):
                continue
        if records:
            first = min(records, key=lambda record: record["time"])
            rank, how = int(first["rank"]), f"raised {first['error']}"
        else:
            how = f"ended with {describe_exit(code)}"
        return f"rank {rank} of {self.processes} {how} (log: {log_path(self.directory, rank)})"
