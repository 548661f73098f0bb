"""``RayTrainer``: Ray Train's ``TorchTrainer``, with our process groups instead of torch's.

``fit()`` starts ``ScalingConfig.num_workers`` Ray actors (``group``), gives each the variables
of one job of ours, and runs ``train_loop_per_worker(train_loop_config)`` in every one of them.
When a worker fails (its loop raises, or its process dies) the whole group is torn down and, up
to ``FailureConfig.max_failures`` times, started again, the loops resuming from the newest
checkpoint every worker had reported (``get_checkpoint()``). Past that, ``fit()`` raises
``TrainingFailedError`` naming the workers and every attempt.
"""
from __future__ import annotations

import os
import secrets
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from . import storage
from .checkpoint import Checkpoint
from .config import DEFAULT_STORAGE, STORAGE_VARIABLE, RunConfig, ScalingConfig
from .group import START_TIMEOUT_S, Member, WorkerGroup
from .result import Result, TrainingFailedError
from .runtime import check_importable, ensure_ray, require_ray

SETTLE_S = 3.0  # after a first failure, how long the others get to report theirs (who caused it)


class RayTrainer:
    def __new__(cls, *args: Any, **kwargs: Any) -> "RayTrainer":
        # RayTrainer(model, config), the model-first spelling, builds its subclass
        # (model_trainer): the two spellings share the run, not their arguments or fit().
        # Python then runs that subclass's __init__ with the same arguments.
        if cls is RayTrainer and args and _is_model(args[0]):
            from .model_trainer import ModelRayTrainer
            return super().__new__(ModelRayTrainer)
        return super().__new__(cls)

    def __init__(self, train_loop_per_worker: Callable, *,
                 train_loop_config: Optional[Dict[str, Any]] = None,
                 scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None,
                 resume_from_checkpoint: Optional[Checkpoint] = None,
                 address: Optional[str] = None) -> None:
        if not callable(train_loop_per_worker):
            raise TypeError(f"train_loop_per_worker must be a function, got "
                            f"{type(train_loop_per_worker).__name__}")
        for name, value, kind in (("train_loop_config", train_loop_config, dict),
                                  ("scaling_config", scaling_config, ScalingConfig),
                                  ("run_config", run_config, RunConfig),
                                  ("resume_from_checkpoint", resume_from_checkpoint, Checkpoint)):
            if value is not None and not isinstance(value, kind):
                raise TypeError(f"{name} must be a {kind.__name__}, got {type(value).__name__}")
        self.loop, self.loop_config = train_loop_per_worker, train_loop_config
        self.scaling = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.resume_from = resume_from_checkpoint
        self.address = address
        self.name = self.run_config.name or time.strftime("RayTrainer_%Y-%m-%d_%H-%M-%S")
        self.storage_path = os.path.abspath(os.path.expanduser(
            self.run_config.storage_path or os.environ.get(STORAGE_VARIABLE)
            or DEFAULT_STORAGE))

    def fit(self) -> Result:
        """Train; the ``Result`` of a finished run, or ``TrainingFailedError``."""
        ray = require_ray()
        cpus = self.scaling.num_workers * self.scaling.worker_resources().get("CPU", 0)
        started = ensure_ray(self.address, num_cpus=int(cpus + 0.999))
        try:
            check_importable(ray, self.loop, START_TIMEOUT_S)
            return self._fit(ray)
        finally:
            if started:  # an embedded Ray ends with the run that started it
                ray.shutdown()

    def _run_dir(self) -> str:
        run_dir = os.path.join(self.storage_path, self.name)
        if os.path.isdir(os.path.join(run_dir, storage.REPORTS)):
            raise ValueError(f"RunConfig(name={self.name!r}): {run_dir} already holds a run's "
                             f"reports; choose another name or remove that folder")
        os.makedirs(run_dir, exist_ok=True)
        return run_dir

    def _fit(self, ray: Any) -> Result:
        run_dir = self._run_dir()
        world = self.scaling.num_workers
        latest = self.resume_from.path if self.resume_from is not None else None
        last_index, history = -1, []
        max_failures = self.run_config.failure_config.max_failures
        attempt = 0
        while True:
            attempt += 1
            first = last_index + 1
            failures, counts = self._attempt(ray, attempt, run_dir, latest, first)
            reports = storage.complete_reports(run_dir, world)
            if reports:
                last_index = reports[-1].index
                latest = storage.latest_checkpoint(reports, run_dir) or latest
            storage.prune_checkpoints(run_dir, reports, self.run_config.checkpoint_config
                                      .num_to_keep)
            if not failures:
                _check_storage_shared(run_dir, counts, first, self.storage_path)
                return Result(reports[-1].metrics if reports else None,
                              Checkpoint(latest) if latest else None, None, run_dir, attempt,
                              [r.metrics for r in reports])
            history.append(f"attempt {attempt}: {_failure_text(failures)}")
            storage.drop_incomplete(run_dir, last_index)
            if max_failures != -1 and attempt > max_failures:
                errors = {rank: _cause(exc) for rank, (_, exc) in failures.items()}
                error = TrainingFailedError(
                    f"RayTrainer {self.name!r}: training failed {attempt} time(s), more than "
                    f"FailureConfig(max_failures={max_failures}) allows; "
                    + "; ".join(history), errors)
                error.result = Result(reports[-1].metrics if reports else None,
                                      Checkpoint(latest) if latest else None, error, run_dir,
                                      attempt, [r.metrics for r in reports])
                raise error from errors[min(errors)]
            where = os.path.basename(latest) if latest else "the start"
            print(f"RayTrainer {self.name!r}: {history[-1]}; restarting from {where} "
                  f"(attempt {attempt + 1})", file=sys.stderr, flush=True)

    def _attempt(self, ray: Any, attempt: int, run_dir: str, checkpoint: Optional[str],
                 next_index: int) -> Tuple[Dict[int, Tuple[Member, BaseException]],
                                           Dict[int, int]]:
        """One start of the worker group: (failures by rank, reports made by rank)."""
        group = WorkerGroup(ray, self.scaling, f"{self.name}-{attempt}-{secrets.token_hex(3)}")
        failures: Dict[int, Tuple[Member, BaseException]] = {}
        try:
            keep = self.run_config.checkpoint_config.num_to_keep
            refs = {m.actor.run.remote(self.loop, self.loop_config, env, context, run_dir,
                                       next_index, checkpoint, keep): m
                    for m, env, context in zip(group.members, group.environment(),
                                               group.contexts(self.name, self.storage_path))}
            counts = _wait_for_workers(ray, refs, failures)
            return failures, counts
        finally:
            group.shutdown(graceful=bool(failures))


def _is_model(value: Any) -> bool:
    from ..nn import Module
    return isinstance(value, Module)


def _wait_for_workers(ray: Any, refs: Dict[Any, Member],
                      failures: Dict[int, Tuple[Member, BaseException]]) -> Dict[int, int]:
    """Wait for every loop to end; after the first failure, the others get ``SETTLE_S``."""
    pending, counts, settle = dict(refs), {}, None
    while pending:
        limit = 1.0 if settle is None else max(0.0, settle - time.monotonic())
        ready, _ = ray.wait(list(pending), num_returns=1, timeout=limit)
        if not ready:
            if settle is not None and time.monotonic() >= settle:
                break
            continue
        member = pending.pop(ready[0])
        try:
            counts[member.rank] = ray.get(ready[0])
        except Exception as exc:
            failures[member.rank] = (member, exc)
            settle = settle if settle is not None else time.monotonic() + SETTLE_S
    return counts


def _cause(exc: BaseException) -> BaseException:
    """The loop's own exception inside Ray's wrapper (Ray's error for a dead worker)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def _died(exc: BaseException) -> bool:
    from ray.exceptions import RayActorError
    return isinstance(exc, RayActorError)


def _failure_text(failures: Dict[int, Tuple[Member, BaseException]]) -> str:
    """The workers whose process died first (the others' loops then fail in their collectives),
    else every worker whose loop raised."""
    died = [(m, e) for m, e in failures.values() if _died(e)]
    if died:
        return "; ".join(f"{m.describe()} died: its process ended (killed or crashed)"
                         for m, _ in sorted(died, key=lambda p: p[0].rank))
    lines = []
    for member, exc in sorted(failures.values(), key=lambda p: p[0].rank):
        cause = _cause(exc)
        first = (str(cause).strip().splitlines() or [""])[0][:300]
        lines.append(f"{member.describe()} raised {type(cause).__name__}: {first}")
    return "; ".join(lines)


def _check_storage_shared(run_dir: str, counts: Dict[int, int], first: int,
                          storage_path: str) -> None:
    """Every report each worker says it made must be readable here; else storage is not shared."""
    seen = storage.ranks_that_reported(run_dir)
    missing: List[int] = sorted(rank for rank, made in counts.items()
                                if made and rank not in seen.get(first + made - 1, ()))
    if missing:
        raise RuntimeError(f"RayTrainer: the reports of worker rank(s) {missing} are not in "
                           f"{run_dir}; RunConfig(storage_path={storage_path!r}) must be a "
                           f"folder every node and the driver share")
