"""``DistributedTuner``: hyperparameter search on Optuna, each trial a job of its own processes.

The tuner process drives the study alone (ask, report, tell: Optuna is used only here) and
runs up to ``max_concurrent_trials`` trials side by side, each a process group of
``processes_per_trial`` ranks started through the launcher (``trial_runner``). Between polls it
hands each trial's new reports to the trial, asks the pruner, and stops a trial it prunes:
all of that trial's processes, at once. A trial that raises is recorded as failed, with the
error, and the study goes on. Stopped by Ctrl-C, the tuner stops every running trial and
queues its config again; killed outright, its trials' processes are stopped by their
launchers' guards, and a tuner started again with the same storage and study name resumes
the study (``study``).
"""
from __future__ import annotations

import glob
import json
import math
import os
import pickle
import time
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence

from ..distributed.launch.config import cpu_count
from ..training.launching import pickle_recipe, stop_main_import
from ..training.launching.worker import RESULT_FILE
from . import study as studies
from .results import TuneResults
from .search_space import split_space
from .session import REPORTS_FILE
from .trial_runner import RunningTrial
from .trial_worker import TrialRecipe

OWNER = "DistributedTuner"
RAY_BACKEND = "ray"     # trials as Ray Tune trials; any other backend names the collectives'
POLL_S = 0.05           # how often running trials are read: a pruning decision waits this long
STOP_WAIT_S = 30.0      # a stopped trial's processes are gone well within this


def _positive(value: Any, name: str, allow_none: bool = False) -> Optional[int]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{OWNER}: {name} must be a positive integer, got {value!r}")
    return value


class DistributedTuner:
    def __init__(self, train_fn: Callable[[Dict[str, Any]], Any], search_space: Mapping[str, Any],
                 num_samples: int = 10, metric: str = "loss", mode: str = "min",
                 processes_per_trial: int = 1, max_concurrent_trials: Optional[int] = None,
                 scheduler: Any = None, storage: Any = None, study_name: Optional[str] = None,
                 seed: Optional[int] = None, *, num_gpus: Optional[int] = None,
                 trials_per_gpu: int = 1, backend: str = "shm", local_dir: str = "tune_runs",
                 points_to_evaluate: Sequence[Mapping[str, Any]] = (),
                 trial_timeout: Optional[float] = None, verbose: bool = True,
                 search: str = "tpe") -> None:
        if not callable(train_fn):
            raise TypeError(f"{OWNER}: train_fn must be a function of the config, got "
                            f"{type(train_fn).__name__}")
        self.train_fn = train_fn
        self.space, self.constants = split_space(search_space)
        self.num_samples = _positive(num_samples, "num_samples")
        if not isinstance(metric, str) or not metric:
            raise ValueError(f"{OWNER}: metric must be the name of a reported metric, got "
                             f"{metric!r}")
        if mode not in ("min", "max"):
            raise ValueError(f"{OWNER}: mode must be 'min' or 'max', got {mode!r}")
        self.metric, self.mode = metric, mode
        self.processes_per_trial = _positive(processes_per_trial, "processes_per_trial")
        self.num_gpus = _positive(num_gpus, "num_gpus", allow_none=True)
        self.trials_per_gpu = _positive(trials_per_gpu, "trials_per_gpu")
        if self.trials_per_gpu > 1 and self.processes_per_trial > 1:
            raise ValueError(f"{OWNER}: trials_per_gpu={trials_per_gpu} shares each GPU "
                             f"between trials of one process, while processes_per_trial="
                             f"{processes_per_trial} gives each rank a GPU of its own; choose "
                             f"one of the two")
        # slots: trials side by side; on GPUs each gets its own (or a share of one)
        devices = cpu_count() if self.num_gpus is None else self.num_gpus * self.trials_per_gpu
        slots = max(1, devices // self.processes_per_trial)
        given = _positive(max_concurrent_trials, "max_concurrent_trials", allow_none=True)
        if given is None:
            given = slots
        elif self.num_gpus is not None:
            given = min(given, slots)  # no more trials than the GPUs hold
        self.max_concurrent_trials = given
        if isinstance(scheduler, str) and scheduler not in studies.PRUNERS:
            raise ValueError(f"{OWNER}: scheduler must be one of {list(studies.PRUNERS)}, "
                             f"None or an optuna pruner, got {scheduler!r}")
        self.scheduler = scheduler
        self.storage, self.seed, self.backend = storage, seed, backend
        self.study_name = study_name or getattr(train_fn, "__name__", "study")
        self.study_dir = os.path.abspath(os.path.join(local_dir, self.study_name))
        self.points_to_evaluate = [dict(p) for p in points_to_evaluate]
        for point in self.points_to_evaluate:
            unknown = sorted(set(point) - set(self.space))
            if unknown:
                raise ValueError(f"{OWNER}: points_to_evaluate names {unknown}, which are not "
                                 f"hyperparameters of search_space {sorted(self.space)}")
        self.trial_timeout, self.verbose = trial_timeout, verbose
        if search not in studies.SEARCHES:
            raise ValueError(f"{OWNER}: search must be one of {list(studies.SEARCHES)}, got "
                             f"{search!r}")
        self.search = search
        self.results: Optional[TuneResults] = None
        if backend == RAY_BACKEND:
            from .ray_backend import check_settings
            check_settings(self)

    @property
    def best_config(self) -> Optional[Dict[str, Any]]:
        return None if self.results is None else self.results.best_config

    @property
    def best_result(self) -> Optional[Dict[str, Any]]:
        return None if self.results is None else self.results.best_result

    # ------------------------------------------------------------------ the search
    def tune(self, num_samples: Optional[int] = None) -> TuneResults:
        """Run the study until ``num_samples`` trials (this call's, else the tuner's) have
        finished, counting those an earlier tuner of the study finished; the results."""
        total = self.num_samples if num_samples is None else _positive(num_samples,
                                                                       "num_samples")
        if self.backend == RAY_BACKEND:  # Ray Tune runs the trials, in its actors
            from .ray_backend import run_search
            self.results = run_search(self, total)
            self._say(repr(self.results))
            return self.results
        stop_main_import(f"{OWNER}.tune")  # a trial process importing an unguarded script
        studies.require_optuna(OWNER)
        lock = studies.StudyLock(self.study_dir)
        lock.acquire()
        try:
            study = studies.open_study(studies.storage_for(self.storage, self.study_dir),
                                       self.study_name, self.mode, self.seed,
                                       studies.pruner_for(self.scheduler), self.search)
            self._prepare(study)
            self._search(study, total)
            self.results = TuneResults.from_study(study, self.metric, self.mode,
                                                  self.constants, self.study_dir)
        finally:
            lock.release()
        self._say(repr(self.results))
        return self.results

    def _prepare(self, study: Any) -> None:
        if not study.get_trials(deepcopy=False):
            for point in self.points_to_evaluate:
                study.enqueue_trial(point)
        kept, queued = studies.requeue_interrupted(
            study, lambda trial: self._recover(study, trial))
        if kept or queued:
            self._say(f"study {self.study_name!r}: of the trials an earlier tuner left "
                      f"running, {kept} had finished (recorded from their files), {queued} "
                      f"were cut off (queued again)")

    def _recover(self, study: Any, trial: Any) -> bool:
        """Record a trial whose processes finished while no tuner was there to see it, from
        the result and reports in its directory; False when it left no usable result."""
        directory = trial.user_attrs.get("dir")
        if not directory or not os.path.exists(os.path.join(directory, RESULT_FILE)) \
                or glob.glob(os.path.join(directory, "rank*.error.json")):
            return False
        with open(os.path.join(directory, RESULT_FILE), "rb") as handle:
            result = pickle.load(handle)
        last: Dict[str, Any] = {}
        try:
            with open(os.path.join(directory, REPORTS_FILE), encoding="utf-8") as handle:
                for line in handle:
                    if line.endswith("\n"):
                        last.update(json.loads(line)["values"])
        except FileNotFoundError:
            pass
        value = self._final_value(result, last)
        if value is None or not math.isfinite(value):
            return False
        study.tell(trial.number, value)
        self._say(f"trial {trial.number} had finished: {self.metric}={value:.6g}")
        return True

    def _search(self, study: Any, total: int) -> None:
        distributions = {name: domain.distribution() for name, domain in self.space.items()}
        finished = studies.finished_count(study)
        if finished:
            self._say(f"study {self.study_name!r}: resuming with {finished} finished "
                      f"trial(s) of {total}")
        running: List[RunningTrial] = []
        try:
            while True:
                free = [s for s in range(self.max_concurrent_trials)
                        if s not in {t.slot for t in running}]
                while free and finished + len(running) < total:
                    running.append(self._start(study, study.ask(distributions), free.pop(0)))
                if not running:
                    return
                time.sleep(POLL_S)
                for trial in list(running):
                    if trial.done():  # its processes are gone: its reports are complete
                        self._read_reports(trial, prune=False)
                        running.remove(trial)
                        self._conclude(study, trial)
                        finished += 1
                    else:
                        self._read_reports(trial)
        except BaseException:
            self._interrupt(study, running)
            raise

    def _start(self, study: Any, trial: Any, slot: int) -> RunningTrial:
        config = studies.config_of(trial.params, self.constants)
        directory = os.path.join(self.study_dir, f"trial_{trial.number:04d}")
        os.makedirs(directory, exist_ok=True)
        trial.set_user_attr("dir", directory)
        payload = pickle_recipe(TrialRecipe(self.train_fn, config, trial.number, directory),
                                {"train_fn": self.train_fn, "config": config}, OWNER)
        self._say(f"trial {trial.number} started: {config}")
        return RunningTrial(trial, config, directory, payload, self.processes_per_trial,
                            self.backend, self._environment(slot), slot, self.trial_timeout)

    def _environment(self, slot: int) -> Dict[str, str]:
        """Each trial's processes: one thread each (trials share the CPUs), and with
        ``num_gpus`` the GPUs of the trial's slot."""
        env = {} if "OMP_NUM_THREADS" in os.environ else {"OMP_NUM_THREADS": "1"}
        if self.num_gpus is not None:
            first = slot * self.processes_per_trial
            devices = sorted({(first + r) // self.trials_per_gpu
                              for r in range(self.processes_per_trial)})
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, devices))
        return env

    def _read_reports(self, running: RunningTrial, prune: bool = True) -> None:
        """The trial's new reports to Optuna; stops the trial when the pruner says so
        (not after it ended: then it ran to its end)."""
        for step, values in running.new_reports():
            if running.pruned_at is not None or self.metric not in values:
                continue
            value = values[self.metric]
            running.trial.report(math.nan if value is None else float(value), step)
            if prune and running.trial.should_prune():
                running.pruned_at = step
                running.stop()

    def _conclude(self, study: Any, running: RunningTrial) -> None:
        from optuna.trial import TrialState
        trial, outcome = running.trial, running.outcome()
        if running.last_values:
            trial.set_user_attr("last_report", dict(running.last_values))
        seconds = time.monotonic() - running.started
        if outcome.kind == "stopped":
            study.tell(trial, state=TrialState.PRUNED)
            self._say(f"trial {trial.number} pruned at step {running.pruned_at} "
                      f"({seconds:.1f} s); its {running.processes} process(es) stopped")
            return
        value, error = None, outcome.error
        if outcome.kind == "success":
            value = self._final_value(outcome.result, running.last_values)
            if value is None or not math.isfinite(value):
                error = (f"train_fn reported no {self.metric!r} (report(...) or its return "
                         f"value)" if value is None else f"{self.metric} is {value}")
        if error is not None:
            trial.set_user_attr("error", error)
            study.tell(trial, state=TrialState.FAIL)
            self._say(f"trial {trial.number} failed ({seconds:.1f} s): {error}")
            return
        study.tell(trial, value)
        self._say(f"trial {trial.number} done: {self.metric}={value:.6g} ({seconds:.1f} s)")

    def _final_value(self, result: Any, last: Mapping[str, Any]) -> Optional[float]:
        """train_fn's returned value (a number, or a dict holding the metric), else the
        last one it reported."""
        if isinstance(result, dict) and self.metric in result:
            result = result[self.metric]
        if isinstance(result, (int, float)) and not isinstance(result, bool):
            return float(result)
        if self.metric not in last:
            return None
        return math.nan if last[self.metric] is None else float(last[self.metric])

    def _interrupt(self, study: Any, running: List[RunningTrial]) -> None:
        """Stop every running trial and queue its config again (Ctrl-C, an error here)."""
        for trial in running:
            trial.stop()
        for trial in running:  # the processes first: they stop even if the storage fails
            trial.join(STOP_WAIT_S)
        for trial in running:
            studies.requeue(study, trial.number, trial.trial.params)
        if running:
            self._say(f"stopped; {len(running)} running trial(s) stopped and queued again")

    def _say(self, text: str) -> None:
        if self.verbose:
            print(f"tune: {text}", flush=True)
