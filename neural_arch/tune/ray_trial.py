"""What each Ray Tune trial runs with ``DistributedTuner(..., backend="ray")``.

``RayTuneTrial(config)`` is the trainable Ray Tune calls in its trial actor. The trial's files
go to ``<study dir>/<Ray's trial name>``, which is also the folder Ray Tune keeps the trial's
results in, so the tuner reads both from one place. With one process per trial, ``train_fn``
runs right there, and each ``neural_arch.tune.report`` is written to ``reports.jsonl`` and
handed to Ray Tune's ``report`` (its scheduler then stops the trial or not). With several,
``train_fn`` runs on the workers of a ``RayTrainer`` (one of our process groups); the trial
reads rank 0's reports from ``reports.jsonl`` as they come and hands each to Ray Tune; a
trial the scheduler stops ends its actor, and its workers, watching it, stop too. When
``train_fn`` returns, ``outcome.json`` records its value, so that a finished trial is told
apart from one the scheduler stopped.
"""
from __future__ import annotations

import json
import math
import os
import re
import signal
import threading
import time
from typing import Any, Callable, Dict, Optional, Tuple

from . import session
from .reports import ReportReader
from .trial_worker import _plain

OUTCOME_FILE = "outcome.json"
STEP_KEY = "step"    # the time attribute of the schedulers: the step given to report
POLL_S = 0.05        # how often a multi-process trial reads its workers' reports
WATCH_S = 0.1        # how often its workers look whether the trial still runs
# A multi-process trial's actor only waits while its workers hold the CPUs: it takes none, and
# Ray Tune needs it to hold something, so it holds memory.
DRIVER_RESOURCES = {"cpu": 0, "memory": 64 * 1024 * 1024}


def trial_number(trial_name: str) -> int:
    """Ray Tune names trials ``<trainable>_<id>_<N>_<params>...``, N counting from 1; the
    trial's number from 0 (as an Optuna study's), or -1 for a name of another form."""
    match = re.search(r"_[0-9a-f]{5,}_(\d+)(?:_|$)", trial_name)
    return int(match.group(1)) - 1 if match else -1


def _forward_to_ray(values: Dict[str, float], step: int) -> None:
    from ray import tune as ray_tune
    ray_tune.report({**values, STEP_KEY: step})


def write_outcome(directory: str, result: Any) -> None:
    """train_fn's value, as it finished (written before the last report to Ray Tune, so
    that a trial stopped right after it still counts as finished)."""
    if isinstance(result, float) and not math.isfinite(result):
        result = None if math.isnan(result) else str(result)
    path = os.path.join(directory, OUTCOME_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump({"result": result, "time": time.time()}, handle)
    os.replace(path + ".tmp", path)


def _this_process() -> Tuple[str, int, int]:
    from ..distributed.processes import host_identity, process_stat
    stat = process_stat(os.getpid())
    return host_identity("pid"), os.getpid(), stat[1] if stat else 0


def _stop_when_gone(trial: Tuple[str, int, int], done: threading.Event) -> None:
    """SIGTERM to this worker once the trial's actor is gone (its scheduler stopped it): the
    worker then leaves its group as a stopped process does, at once, instead of waiting for
    Ray to reap it."""
    from ..distributed.processes import process_alive
    while not done.wait(WATCH_S):
        if not process_alive(trial[1], trial[2]):
            os.kill(os.getpid(), signal.SIGTERM)
            return


class WorkerLoop:
    """The loop of each RayTrainer worker of a multi-process trial: ``train_fn`` with the
    trial's context, the rank taken from the Ray worker's. ``trial``: (host, pid, start
    time) of the trial's actor, which the workers on its host watch."""

    def __init__(self, train_fn: Callable, number: int, directory: str,
                 trial: Tuple[str, int, int]) -> None:
        self.train_fn, self.number, self.directory = train_fn, number, directory
        self.trial = trial

    def __call__(self, config: Dict[str, Any]) -> None:
        from ..ray import get_context
        context = get_context()
        rank, world = context.get_world_rank(), context.get_world_size()
        done = threading.Event()
        if self.trial[0] == _this_process()[0]:  # elsewhere: Ray ends them with the trial
            threading.Thread(target=_stop_when_gone, args=(self.trial, done),
                             name="tune-trial-watch", daemon=True).start()
        session.start(session.TrialContext(self.number, self.directory, rank, world))
        try:
            result = _plain(self.train_fn(dict(config)))
        finally:
            done.set()
            session.end()
        if rank == 0:
            write_outcome(self.directory, result)


class RayTuneTrial:
    def __init__(self, train_fn: Callable, study_dir: str, processes: int, metric: str,
                 use_gpu: bool = False) -> None:
        self.train_fn, self.study_dir, self.processes = train_fn, study_dir, processes
        self.metric, self.use_gpu = metric, use_gpu
        # Ray Tune names the trainable after this; trial folders begin with it
        self.__name__ = getattr(train_fn, "__name__", "train_fn")

    def __call__(self, config: Dict[str, Any]) -> None:
        from ray import tune as ray_tune
        name = os.path.basename(ray_tune.get_context().get_trial_dir())
        directory = os.path.join(self.study_dir, name)
        os.makedirs(directory, exist_ok=True)
        number = trial_number(name)
        if self.processes == 1:
            context = session.TrialContext(number, directory, 0, 1, forward=_forward_to_ray)
            session.start(context)
            try:
                result = _plain(self.train_fn(dict(config)))
            finally:
                session.end()
            write_outcome(directory, result)
            last_step = context.last_step
        else:
            last_step = self._on_workers(config, number, directory)
            with open(os.path.join(directory, OUTCOME_FILE), encoding="utf-8") as handle:
                result = json.load(handle)["result"]
        final = result.get(self.metric) if isinstance(result, dict) else result
        if isinstance(final, (int, float)) and not isinstance(final, bool):
            # the returned value is the trial's: the search algorithm learns it too
            _forward_to_ray({self.metric: float(final)}, 0 if last_step is None else last_step)

    def _on_workers(self, config: Dict[str, Any], number: int,
                    directory: str) -> Optional[int]:
        """train_fn on a RayTrainer's workers; rank 0's reports go to Ray Tune as they come.
        Returns the step of the last report. A worker that fails fails the trial."""
        from ..ray import RayTrainer, RunConfig, ScalingConfig
        trainer = RayTrainer(WorkerLoop(self.train_fn, number, directory, _this_process()),
                             train_loop_config=dict(config),
                             scaling_config=ScalingConfig(num_workers=self.processes,
                                                          use_gpu=self.use_gpu),
                             run_config=RunConfig(name="workers", storage_path=directory))
        failure: list = []

        def fit() -> None:
            try:
                trainer.fit()
            except BaseException as exc:  # the trial raises it, from its own thread
                failure.append(exc)

        thread = threading.Thread(target=fit, name="tune-trial-workers", daemon=True)
        thread.start()
        reader, last_step = ReportReader(directory), None
        while True:
            finished = not thread.is_alive()  # then every report is in the file
            for step, values in reader.new_reports():
                _forward_to_ray({k: (math.nan if v is None else v) for k, v in values.items()},
                                step)
                last_step = step
            if finished:
                break
            time.sleep(POLL_S)
        if failure:
            raise failure[0]
        return last_step
