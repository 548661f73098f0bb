"""``DistributedTuner(..., backend="ray")``: the same search run by Ray Tune.

Ray Tune's ``Tuner`` runs the trials (``ray_trial.RayTuneTrial``), its ``OptunaSearch``
samples the search space (the same Optuna distributions and TPE sampler as the default
backend), and the scheduler is Ray's own: ``"asha"`` its ``ASHAScheduler``, ``"median"`` its
``MedianStoppingRule``, both counting in the ``step`` given to ``report``; a Ray
``TrialScheduler`` is used as given. The results come back as the same ``TuneResults`` table.
Without a Ray in the process, one is started on this machine for the search and shut down
after it. Needs the ``ray`` extra (Ray Tune) and the ``tune`` extra (Optuna).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from .ray_trial import DRIVER_RESOURCES, OUTCOME_FILE, STEP_KEY, RayTuneTrial, trial_number
from .reports import ReportReader
from .results import TuneResults

OWNER = "DistributedTuner(backend='ray')"
INSTALL_HINT = "pip install 'neural-arch[ray,tune]'"
ASHA_MAX_STEPS = 10 ** 9  # ASHA stops a trial at max_t: no limit here, as with Optuna's


def require_ray_tune() -> Any:
    """``ray.tune``; ImportError naming the extras when Ray, Ray Tune's packages (pandas,
    pyarrow, ...) or Optuna are missing."""
    try:
        import optuna  # noqa: F401 - OptunaSearch samples with it
        from ray import tune as ray_tune
        from ray.tune.search.optuna import OptunaSearch  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{OWNER} needs Ray Tune and Optuna ({exc}); install them with "
                          f"{INSTALL_HINT}") from exc
    return ray_tune


def scheduler_for(scheduler: Any) -> Any:
    """Ray's scheduler for the tuner's ``scheduler`` setting (None: Ray's FIFO)."""
    from ray.tune.schedulers import ASHAScheduler, MedianStoppingRule, TrialScheduler
    if scheduler is None or isinstance(scheduler, TrialScheduler):
        return scheduler
    if scheduler == "asha":
        return ASHAScheduler(time_attr=STEP_KEY, grace_period=1, reduction_factor=4,
                             max_t=ASHA_MAX_STEPS)
    if scheduler == "median":
        return MedianStoppingRule(time_attr=STEP_KEY, grace_period=1, min_samples_required=3)
    raise ValueError(f"{OWNER}: scheduler must be 'asha', 'median', None or a Ray Tune "
                     f"TrialScheduler, got {scheduler!r} (Optuna pruners are for the default "
                     f"backend)")


def check_settings(tuner: Any) -> None:
    """ValueError for what the Ray backend does not do (the Optuna study's settings)."""
    if tuner.storage is not None:
        raise ValueError(f"{OWNER}: storage={tuner.storage!r} is an Optuna study's storage; "
                         f"Ray Tune keeps its trials under local_dir; leave storage=None")
    if tuner.trial_timeout is not None:
        raise ValueError(f"{OWNER}: trial_timeout={tuner.trial_timeout!r} is not supported; "
                         f"leave it None")


def _resources(tuner: Any, ray: Any) -> Tuple[Dict[str, float], bool]:
    """(what each trial's actor holds, whether its workers take a GPU). GPUs are asked for
    only where the cluster has some: elsewhere ``num_gpus`` only sets the concurrency."""
    gpus = tuner.num_gpus is not None and ray.cluster_resources().get("GPU", 0) > 0
    if tuner.processes_per_trial > 1:
        return dict(DRIVER_RESOURCES), gpus
    return ({"cpu": 1, "gpu": 1.0 / tuner.trials_per_gpu} if gpus else {"cpu": 1}), False


def run_search(tuner: Any, total: int) -> TuneResults:
    check_settings(tuner)
    ray_tune = require_ray_tune()
    from ..ray.runtime import ensure_ray, require_ray
    ray = require_ray()
    started = ensure_ray(num_cpus=tuner.max_concurrent_trials * tuner.processes_per_trial)
    try:
        grid = _fit(tuner, total, ray, ray_tune)
        return read_results(grid, tuner)
    finally:
        if started:
            ray.shutdown()


def _fit(tuner: Any, total: int, ray: Any, ray_tune: Any) -> Any:
    import optuna
    from ray.tune.search.optuna import OptunaSearch
    search = OptunaSearch(
        space={name: domain.distribution() for name, domain in tuner.space.items()},
        metric=tuner.metric, mode=tuner.mode,
        points_to_evaluate=[dict(p) for p in tuner.points_to_evaluate] or None,
        sampler=(optuna.samplers.TPESampler if tuner.search == "tpe"
                 else optuna.samplers.RandomSampler)(seed=tuner.seed))
    resources, use_gpu = _resources(tuner, ray)
    trainable = ray_tune.with_resources(
        RayTuneTrial(tuner.train_fn, tuner.study_dir, tuner.processes_per_trial, tuner.metric,
                     use_gpu), resources)
    os.makedirs(tuner.study_dir, exist_ok=True)
    return ray_tune.Tuner(
        trainable, param_space=dict(tuner.constants),
        tune_config=ray_tune.TuneConfig(
            metric=tuner.metric, mode=tuner.mode, search_alg=search,
            scheduler=scheduler_for(tuner.scheduler), num_samples=total,
            max_concurrent_trials=tuner.max_concurrent_trials, reuse_actors=False),
        run_config=ray_tune.RunConfig(
            name=tuner.study_name, storage_path=os.path.dirname(tuner.study_dir),
            verbose=1 if tuner.verbose else 0,
            failure_config=ray_tune.FailureConfig(max_failures=0))).fit()


def _cause(error: BaseException) -> BaseException:
    """The trial's own exception inside Ray's wrappers."""
    while getattr(error, "cause", None) is not None and error.cause is not error:
        error = error.cause
    return error


def _row(result: Any, tuner: Any, order: int) -> Tuple[Dict[str, Any], List]:
    directory = result.path
    reader = ReportReader(directory)
    reports = reader.new_reports()
    outcome: Optional[Dict[str, Any]] = None
    try:
        with open(os.path.join(directory, OUTCOME_FILE), encoding="utf-8") as handle:
            outcome = json.load(handle)
    except FileNotFoundError:
        pass
    value, error = None, None
    if result.error is not None:
        cause = _cause(result.error)
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        state, error = "FAIL", f"raised {type(cause).__name__}: {first}"
    elif outcome is None:
        state = "PRUNED"  # stopped by the scheduler before train_fn returned
        value = reader.last_values.get(tuner.metric)
    else:
        state = "COMPLETE"
        value = tuner._final_value(outcome["result"], reader.last_values)
        if value is None or not math.isfinite(value):
            state = "FAIL"
            error = (f"train_fn reported no {tuner.metric!r} (report(...) or its return "
                     f"value)" if value is None else f"{tuner.metric} is {value}")
            value = None
    number = trial_number(os.path.basename(directory))
    metrics = result.metrics or {}
    row = {"trial": number if number >= 0 else order, "state": state,
           "config": dict(result.config or {}), tuner.metric: value,
           "steps": len(reports), "last_step": reports[-1][0] if reports else None,
           "last_report": dict(reader.last_values) or None, "error": error,
           "retry_of": None, "seconds": metrics.get("time_total_s"), "dir": directory}
    curve = [(step, values[tuner.metric]) for step, values in reports
             if values.get(tuner.metric) is not None]
    return row, curve


def read_results(grid: Any, tuner: Any) -> TuneResults:
    rows, curves = [], {}
    for order, result in enumerate(grid):
        row, curve = _row(result, tuner, order)
        rows.append(row)
        curves[row["trial"]] = curve
    rows.sort(key=lambda row: row["trial"])
    return TuneResults(rows, curves, tuner.metric, tuner.mode, tuner.study_name,
                       tuner.study_dir)

