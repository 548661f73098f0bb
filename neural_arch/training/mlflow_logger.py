"""``MLflowLogger``: a Trainer callback that records a run in MLflow, written by rank 0 only.

What one run holds: the parameters (every ``TrainingConfig`` field, the data-parallel world
size, the strategy, the model's and the optimizer's class, and any ``params`` given), the
metrics of each logging interval (``train/loss``, ``train/lr``, ... at the optimizer step)
and of each epoch (``epoch/train_loss``, ``epoch/val_loss``, ... at the step the epoch ended:
the names and steps TensorBoard gets from ``metrics``), and at the end of ``fit`` the loss
chart (``loss.png``), the newest checkpoint of ``checkpoint_dir`` (under ``checkpoint/``) and
``metrics.jsonl`` when ``metrics_dir`` is set.

Where it goes: ``tracking_uri`` when given, else ``MLFLOW_TRACKING_URI`` when set, else a
SQLite store ``mlflow.db`` in ``directory`` (default: the run's ``metrics_dir``, else
``./mlruns``). The artifacts of a new experiment go beside a SQLite store's database, in
``artifacts/``. MLflow refuses its plain-folder store unless told otherwise, and SQLite needs
no server: every rank-0 process of any job can write there.

With ``run_id`` the callback logs into that existing run instead (``for_active_run``: the run
a script opened with ``mlflow.start_run()`` around the training call, as ``PyTorchDDPTrainer(...,
mlflow_tracking=True)`` does), and leaves it running at the end of ``fit`` for its owner to end.

The other ranks construct the callback alike and do nothing with it, so a job of N processes
makes exactly one run. The run's id is part of the callback's state in the Trainer's
checkpoints: a resumed fit goes on in the same run.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import tempfile
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .callbacks import Callback
from .tracking_common import require_package, tagged_numbers

INSTALL_HINT = "pip install 'neural-arch[mlflow]'"
DEFAULT_DIRECTORY = "mlruns"
_SQLITE = "sqlite:///"


def require_mlflow(owner: str) -> None:
    """RuntimeError naming the extra to install when MLflow is missing; called where the
    logger is asked for, before any worker process starts."""
    require_package("mlflow", owner, "MLflow tracking needs", "mlflow")


def for_active_run(experiment: Optional[str], owner: str) -> "MLflowLogger":
    """A logger into the MLflow run active in this process (``mlflow.start_run()``), at this
    process's tracking URI; with no active run, one that starts its own run in ``experiment``
    (default "neural_arch"). Called in the process that launches the job: its workers cannot
    see that process's active run."""
    require_mlflow(owner)
    import mlflow
    run = mlflow.active_run()
    if run is None:
        return MLflowLogger(experiment or "neural_arch")
    return MLflowLogger(tracking_uri=mlflow.get_tracking_uri(), run_id=run.info.run_id)


def with_mlflow(callbacks: Sequence[Callback], experiment: str) -> List[Callback]:
    """``callbacks`` with an ``MLflowLogger`` for ``experiment`` added, unless one is there."""
    if any(isinstance(c, MLflowLogger) and c.experiment == experiment for c in callbacks):
        return list(callbacks)
    return [*callbacks, MLflowLogger(experiment)]


class MLflowLogger(Callback):
    def __init__(self, experiment: str = "neural_arch", tracking_uri: Optional[str] = None,
                 run_name: Optional[str] = None, directory: Optional[str] = None,
                 params: Optional[Dict[str, Any]] = None, run_id: Optional[str] = None) -> None:
        if not isinstance(experiment, str) or not experiment:
            raise ValueError(f"MLflowLogger: experiment must be a non-empty name, got "
                             f"{experiment!r}")
        require_mlflow("MLflowLogger")
        self.experiment, self.tracking_uri, self.run_name = experiment, tracking_uri, run_name
        # resolved here: the process that builds the logger may not be the one that writes
        self.directory = None if directory is None else os.path.abspath(directory)
        self.params = dict(params or {})
        self.run_id: Optional[str] = run_id
        self._external = run_id is not None  # someone else's run: never ended here
        self._client: Any = None
        self._curves: Dict[str, Tuple[List[int], List[float]]] = {"train": ([], []),
                                                                 "val": ([], [])}

    # ------------------------------------------------------------------ the store
    def _store(self, trainer: Any) -> Tuple[str, Optional[str]]:
        """(tracking URI, artifact location for a new experiment; None: the store's default).
        A SQLite store keeps a new experiment's artifacts beside its database (MLflow's
        default would be ``./mlruns`` in whatever directory the job runs in)."""
        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if uri:
            if uri.startswith(_SQLITE):
                database = os.path.abspath(uri[len(_SQLITE):])
                return uri, os.path.join(os.path.dirname(database), "artifacts")
            return uri, None
        directory = self.directory or os.path.abspath(
            trainer.config.metrics_dir or DEFAULT_DIRECTORY)
        os.makedirs(directory, exist_ok=True)
        return (f"sqlite:///{os.path.join(directory, 'mlflow.db')}",
                os.path.join(directory, "artifacts"))

    def _experiment_id(self, artifacts: Optional[str]) -> str:
        found = self._client.get_experiment_by_name(self.experiment)
        if found is None:
            return self._client.create_experiment(self.experiment, artifact_location=artifacts)
        if found.lifecycle_stage != "active":
            raise ValueError(f"MLflowLogger: experiment {self.experiment!r} is deleted in "
                             f"{self._client.tracking_uri}; restore it or choose another name")
        return found.experiment_id

    def _parameters(self, trainer: Any) -> Dict[str, str]:
        values: Dict[str, Any] = dataclasses.asdict(trainer.config)
        values.update(world_size=trainer.world, strategy=trainer.strategy.name,
                      model=type(trainer.model).__name__,
                      optimizer=type(trainer.optimizer).__name__)
        values.update(self.params)
        return {str(k): str(v)[:6000] for k, v in values.items()}  # MLflow's length limit

    # ------------------------------------------------------------------ the callback
    def on_fit_start(self, trainer: Any) -> None:
        if not trainer.is_logger:
            return
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        uri, artifacts = self._store(trainer)
        self._client = MlflowClient(tracking_uri=uri)
        if self.run_id is not None and not self._external:  # resumed: the same run goes on
            self._client.update_run(self.run_id, status="RUNNING")
            return
        if self.run_id is None:
            run = self._client.create_run(self._experiment_id(artifacts),
                                          run_name=self.run_name,
                                          tags={"neural_arch.world_size": str(trainer.world)})
            self.run_id = run.info.run_id
        params = [Param(k, v) for k, v in self._parameters(trainer).items()]
        for start in range(0, len(params), 100):  # MLflow takes 100 a batch
            self._client.log_batch(self.run_id, params=params[start:start + 100])

    def on_step_end(self, trainer: Any, logs: Dict[str, Any]) -> None:
        if self._client is None:
            return
        metrics = tagged_numbers(logs, "train")
        if "train/loss" in metrics:
            self._curves["train"][0].append(trainer.step)
            self._curves["train"][1].append(metrics["train/loss"])
        self._log(metrics, trainer.step)

    def on_epoch_end(self, trainer: Any, logs: Dict[str, Any]) -> None:
        if self._client is None:
            return
        metrics = tagged_numbers(logs, "epoch")
        if "epoch/val_loss" in metrics:
            self._curves["val"][0].append(trainer.step)
            self._curves["val"][1].append(metrics["epoch/val_loss"])
        self._log(metrics, trainer.step)

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        if self._client is None:
            return
        scratch = tempfile.mkdtemp(prefix="neural_arch_mlflow_")
        try:
            chart = os.path.join(scratch, "loss.png")
            if draw_loss_chart(self._curves, self.experiment, chart):
                self._client.log_artifact(self.run_id, chart)
            checkpoint = newest_checkpoint(trainer.config.checkpoint_dir)
            if checkpoint is not None:
                self._client.log_artifacts(self.run_id, checkpoint,
                                           f"checkpoint/{os.path.basename(checkpoint)}")
            if trainer.config.metrics_dir is not None:
                from .metrics import METRICS_FILE
                metrics_file = os.path.join(trainer.config.metrics_dir, METRICS_FILE)
                if os.path.exists(metrics_file):
                    self._client.log_artifact(self.run_id, metrics_file)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        if not self._external:
            self._client.set_terminated(self.run_id, "FINISHED")
        self._client = None

    def _log(self, metrics: Dict[str, float], step: int) -> None:
        if not metrics:
            return
        from mlflow.entities import Metric
        stamp = int(time.time() * 1000)
        self._client.log_batch(self.run_id, metrics=[Metric(key, value, stamp, step)
                                                     for key, value in metrics.items()])

    # ------------------------------------------------------------------ checkpoints
    def state_dict(self) -> Dict[str, Any]:
        return {"run_id": self.run_id}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.run_id = state.get("run_id")


def newest_checkpoint(directory: Optional[str]) -> Optional[str]:
    """The newest finished checkpoint in ``directory`` (this rank's), or None."""
    if directory is None:
        return None
    from ..distributed.checkpoint.directory import CheckpointDirectory
    found = CheckpointDirectory(directory).list()
    return found[-1] if found else None


def draw_loss_chart(curves: Dict[str, Tuple[List[int], List[float]]], title: str,
                    out: str) -> bool:
    """The training loss of each interval and each epoch's validation loss against the
    optimizer step, into ``out``; False (with a line saying why) when there is nothing to
    draw or matplotlib is not installed."""
    if not curves["train"][0] and not curves["val"][0]:
        return False
    try:
        import matplotlib  # noqa: F401 - only whether it is installed
    except ImportError:
        print("MLflowLogger: matplotlib is not installed: no loss chart in the run; "
              f"{INSTALL_HINT}", flush=True)
        return False
    from ..plot_metrics import draw_curves
    draw_curves(curves, title, out, dpi=100)
    return True
