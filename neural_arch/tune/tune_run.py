"""``tune.run``: Ray Tune's function-style entry point, on ``DistributedTuner``.

    analysis = tune.run(train_fn, config={"lr": tune.loguniform(1e-4, 1e-2), ...},
                        num_samples=20, resources_per_trial={"gpu": 1})
    analysis.best_config, analysis.get_best_config("accuracy", "max"), analysis.results

As in Ray Tune, configs are drawn at random (``search="tpe"`` asks for Optuna's TPE) and no
trial is stopped early unless ``scheduler`` says so. ``metric`` and ``mode`` may be left out:
the metric is then the one number ``train_fn`` returns (``return {"accuracy": acc}``), and the
mode follows its name (accuracy, auc, f1, precision, recall, score, reward: "max"; loss,
error, mse, mae, rmse, perplexity: "min"; any other name asks for ``mode=``).
``resources_per_trial``: ``{"cpu": c}`` runs cpus // c trials at a time; ``{"gpu": g}`` with
g <= 1 gives each trial one GPU (or a 1/g share), on the GPUs ``CUDA_VISIBLE_DEVICES`` names;
without any, the trials run on the CPU.
"""
from __future__ import annotations

import json
import os
from typing import Any, Callable, Dict, Mapping, Optional

from ..distributed.launch.config import cpu_count
from . import session
from .results import TuneResults
from .tuner import DistributedTuner

OBJECTIVE = "objective"            # what the tuner optimizes when metric is left out
METRIC_FILE = "returned_metric.json"
_MAX_WORDS = ("accuracy", "acc", "auc", "f1", "precision", "recall", "score", "reward")
_MIN_WORDS = ("loss", "error", "err", "mse", "mae", "rmse", "perplexity", "ppl")


def mode_for(metric: str) -> str:
    """"max" or "min" from the metric's name (its last word: val_accuracy -> accuracy)."""
    word = metric.lower().replace("-", "_").split("_")[-1].split("/")[-1]
    if word in _MAX_WORDS:
        return "max"
    if word in _MIN_WORDS:
        return "min"
    raise ValueError(f"tune.run: cannot tell from its name whether {metric!r} is to be "
                     f"minimized or maximized; pass mode='min' or mode='max'")


class ReturnedMetric:
    """train_fn, its one returned number as the tuner's objective; the number's name is
    written into the trial's directory, for the analysis to name the metric."""

    def __init__(self, train_fn: Callable) -> None:
        self.train_fn = train_fn
        self.__name__ = getattr(train_fn, "__name__", "train_fn")

    def __call__(self, config: Dict[str, Any]) -> Dict[str, float]:
        result = self.train_fn(config)
        numbers = {k: v for k, v in result.items() if isinstance(v, (int, float))
                   and not isinstance(v, bool)} if isinstance(result, dict) else {}
        if len(numbers) != 1:
            raise ValueError(f"tune.run without metric=: train_fn must return one number in a "
                             f"dict (e.g. {{'accuracy': 0.9}}), got {result!r}; or pass "
                             f"metric= and mode=")
        (name, value), = numbers.items()
        if int(os.environ.get("RANK", "0")) == 0:
            with open(os.path.join(session.trial_dir(), METRIC_FILE), "w") as handle:
                json.dump({"metric": name}, handle)
        return {OBJECTIVE: float(value)}


class ExperimentAnalysis:
    """What ``tune.run`` returns: the table (``results``: a ``TuneResults``), the best."""

    def __init__(self, results: TuneResults, metric: str, mode: str) -> None:
        self.results, self.default_metric, self.default_mode = results, metric, mode
        self.trials = results.trials

    def _value(self, row: Mapping[str, Any], metric: str) -> Optional[float]:
        if metric in row:
            return row[metric]
        return (row.get("last_report") or {}).get(metric)

    def get_best_trial(self, metric: Optional[str] = None,
                       mode: Optional[str] = None) -> Optional[Dict[str, Any]]:
        metric = metric or self.default_metric
        mode = mode or (self.default_mode if metric == self.default_metric else mode_for(metric))
        if mode not in ("min", "max"):
            raise ValueError(f"ExperimentAnalysis: mode must be 'min' or 'max', got {mode!r}")
        done = [row for row in self.trials if row["state"] == "COMPLETE"
                and self._value(row, metric) is not None]
        if not done:
            return None
        return (min if mode == "min" else max)(done, key=lambda row: self._value(row, metric))

    def get_best_config(self, metric: Optional[str] = None,
                        mode: Optional[str] = None) -> Optional[Dict[str, Any]]:
        best = self.get_best_trial(metric, mode)
        return None if best is None else dict(best["config"])

    @property
    def best_trial(self) -> Optional[Dict[str, Any]]:
        return self.get_best_trial()

    @property
    def best_config(self) -> Optional[Dict[str, Any]]:
        return self.get_best_config()

    @property
    def best_result(self) -> Optional[float]:
        best = self.get_best_trial()
        return None if best is None else self._value(best, self.default_metric)

    def __repr__(self) -> str:
        return (f"ExperimentAnalysis({len(self.trials)} trials; best "
                f"{self.default_metric}={self.best_result} {self.best_config})")


def _concurrency(resources: Optional[Mapping[str, float]]) -> Dict[str, Any]:
    """DistributedTuner's settings for Ray Tune's ``resources_per_trial``."""
    resources = {str(k).lower(): v for k, v in (resources or {}).items()}
    unknown = sorted(set(resources) - {"cpu", "gpu"})
    if unknown:
        raise ValueError(f"tune.run: resources_per_trial may hold 'cpu' and 'gpu', got "
                         f"{unknown}")
    settings: Dict[str, Any] = {}
    gpu = resources.get("gpu", 0)
    if gpu:
        if gpu > 1:
            raise ValueError(f"tune.run: resources_per_trial gpu={gpu}: a trial here has one "
                             f"GPU per process; use DistributedTuner(processes_per_trial="
                             f"{int(gpu)})")
        visible = [d for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d]
        if visible:
            settings.update(num_gpus=len(visible), trials_per_gpu=max(1, round(1 / gpu)))
    cpu = resources.get("cpu")
    if cpu and "num_gpus" not in settings:
        settings["max_concurrent_trials"] = max(1, int(cpu_count() // cpu))
    return settings


def run(train_fn: Callable, config: Mapping[str, Any], num_samples: int = 1,
        metric: Optional[str] = None, mode: Optional[str] = None, scheduler: Any = None,
        resources_per_trial: Optional[Mapping[str, float]] = None,
        max_concurrent_trials: Optional[int] = None, local_dir: str = "tune_runs",
        name: Optional[str] = None, search: str = "random", seed: Optional[int] = None,
        backend: str = "shm", verbose: bool = True, **tuner_settings: Any
        ) -> ExperimentAnalysis:
    if metric is None and scheduler is not None:
        raise ValueError(f"tune.run: scheduler={scheduler!r} compares trials by a metric; "
                         f"pass metric= and mode=")
    if metric is not None and mode is None:
        mode = mode_for(metric)
    settings = _concurrency(resources_per_trial)
    if max_concurrent_trials is not None:
        settings["max_concurrent_trials"] = max_concurrent_trials
    tuner = DistributedTuner(
        ReturnedMetric(train_fn) if metric is None else train_fn, config,
        num_samples=num_samples, metric=metric or OBJECTIVE, mode=mode or "max",
        scheduler=scheduler, study_name=name or getattr(train_fn, "__name__", "tune_run"),
        seed=seed, backend=backend, local_dir=local_dir, search=search, verbose=verbose,
        **settings, **tuner_settings)
    results = tuner.tune()
    if metric is not None:
        return ExperimentAnalysis(results, metric, mode)
    named = _returned_name(results)
    for row in results.trials:  # the objective under its own name
        row[named] = row.pop(OBJECTIVE)
    return ExperimentAnalysis(TuneResults(results.trials, results._curves, named,
                                          mode or mode_for(named), results.study_name,
                                          results.study_dir), named, mode or mode_for(named))


def _returned_name(results: TuneResults) -> str:
    names = set()
    for row in results.trials:
        try:
            with open(os.path.join(row["dir"] or "", METRIC_FILE)) as handle:
                names.add(json.load(handle)["metric"])
        except (OSError, ValueError, KeyError):
            continue
    if len(names) != 1:
        raise ValueError(f"tune.run: the trials returned {sorted(names) or 'no'} metric(s); "
                         f"pass metric= and mode=")
    return names.pop()
