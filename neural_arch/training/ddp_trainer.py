"""``PyTorchDDPTrainer``: one object that trains a model data parallel in N processes it starts
itself, in the spelling of PyTorch DDP wrappers::

    trainer = PyTorchDDPTrainer(model=MyModel(), num_gpus=8, batch_size=256, epochs=50)
    history = trainer.fit(train_loader, val_loader, checkpoint_dir="./checkpoints")

``fit`` runs ``fit_in_processes`` (``launching``): each worker builds a ``TrainingConfig`` and a
``Trainer`` from these settings around its copy of the model; rank 0's ``History`` comes back,
and with it the trained weights, loaded into ``trainer.model`` (ZeRO stages 0 and 1, where
every rank holds the whole model; with 2 and 3 they are in ``checkpoint_dir``). ``num_gpus``
(alias ``num_processes``) counts processes: without a GPU they all run on the CPU.
``batch_size`` is per process, so a step sees ``num_gpus * batch_size`` samples.

MLflow: ``mlflow_tracking=True`` (or ``fit(..., mlflow_experiment="name")``) has rank 0 record
the run; inside ``with mlflow.start_run():`` it logs into that run, which the caller goes on
using and ends, else it starts a run of its own (``MLflowLogger``). TensorBoard:
``tensorboard_dir="./runs"`` (or ``tensorboard=True``: ``runs/<date>_<host>``, as torch's
``SummaryWriter()``) has rank 0 write event files (``TensorBoardLogger``), every
``log_every_n_steps`` (``TrainingConfig.log_interval``) and at each epoch's end.

``config=DistributedConfig(...)``: the fields it was given set these keywords
(``distributed_config``, ``ddp_settings``); the same setting also passed here with another
value is refused.
``find_unused_parameters=True``: DDP lets parameters that take no part in the loss through.
"""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Optional

from .. import functional as F
from ..data import DataLoader
from ..optim import SGD, Adam, AdamW
from .config import TrainingConfig
from .ddp_recipe import DDPRecipe
from .ddp_settings import check_unused_parameters, config_arguments, tensorboard_folder
from .launching.fit import check_num_processes, under_launcher
from .launching.processes import run_in_processes
from .launching.main_import import stop_main_import
from .launching.recipe_check import pickle_recipe
from .mlflow_logger import for_active_run

OWNER = "PyTorchDDPTrainer"
OPTIMIZERS = {"adam": Adam, "adamw": AdamW, "sgd": SGD}
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(TrainingConfig)}


class PyTorchDDPTrainer:
    def __init__(self, model: Any, num_gpus: Optional[int] = None,
                 batch_size: Optional[int] = None, epochs: int = 1,
                 learning_rate: float = 1e-3, optimizer: Any = "adam", loss_fn: Any = None,
                 mixed_precision: bool = False, gradient_accumulation_steps: int = 1,
                 zero_stage: int = 0, scaler_init_scale: float = 65536.0,
                 scaler_growth_interval: int = 1000, backend: str = "shm", seed: int = 0,
                 num_processes: Optional[int] = None, timeout: Optional[float] = None,
                 mlflow_tracking: bool = False, tensorboard: Optional[bool] = None,
                 tensorboard_dir: Optional[str] = None, log_every_n_steps: Optional[int] = None,
                 find_unused_parameters: bool = False, config: Any = None,
                 **settings: Any) -> None:
        arguments = {k: v for k, v in locals().items() if k in _DEFAULTS}
        if "log_interval" in settings:  # TrainingConfig's name for log_every_n_steps
            interval = settings.pop("log_interval")
            if log_every_n_steps is not None and log_every_n_steps != interval:
                raise ValueError(f"{OWNER}: log_every_n_steps={log_every_n_steps} and "
                                 f"log_interval={interval} both set it; give one of them")
            arguments["log_every_n_steps"] = interval
        self.checkpoint_dir, self.layout, self._join_backend = None, {}, "auto"
        # the setting that asks for checkpoints every N epochs, named if there is no folder
        self._epochs_setting = "save_every_epochs" if "save_every_epochs" in settings else None
        if config is not None:
            self.checkpoint_dir, self.layout = config_arguments(config, arguments, _DEFAULTS,
                                                                settings)
            if "checkpoint_frequency" in config.given:
                self._epochs_setting = "DistributedConfig.checkpoint_frequency"
            if "communication_backend" in config.given:  # the job's group is joined with it
                self._join_backend = arguments["backend"]
        self._setup(model, settings, **arguments)

    def _setup(self, model: Any, settings: dict, num_gpus: Optional[int],
               batch_size: Optional[int], epochs: int, learning_rate: float, optimizer: Any,
               loss_fn: Any, mixed_precision: bool, gradient_accumulation_steps: int,
               zero_stage: int, scaler_init_scale: float, scaler_growth_interval: int,
               backend: str, seed: int, num_processes: Optional[int], timeout: Optional[float],
               mlflow_tracking: bool, tensorboard: Optional[bool],
               tensorboard_dir: Optional[str], log_every_n_steps: Optional[int],
               find_unused_parameters: bool) -> None:
        if num_gpus is not None and num_processes is not None and num_gpus != num_processes:
            raise ValueError(f"{OWNER}: num_gpus={num_gpus} and its alias num_processes="
                             f"{num_processes} disagree; pass one of them")
        count = num_gpus if num_gpus is not None else num_processes
        self.num_processes = check_num_processes(1 if count is None else count,
                                                 "num_gpus", OWNER)
        if batch_size is not None:
            check_num_processes(batch_size, "batch_size", OWNER)
        self.model, self.batch_size, self.backend, self.timeout = (model, batch_size, backend,
                                                                   timeout)
        self.learning_rate = float(learning_rate)
        if isinstance(optimizer, str) and optimizer.lower() not in OPTIMIZERS:
            raise ValueError(f"{OWNER}: optimizer={optimizer!r} is none of {sorted(OPTIMIZERS)}; "
                             f"or pass an optimizer class, called as cls(params, lr=...)")
        if not isinstance(optimizer, str) and not callable(optimizer):
            raise TypeError(f"{OWNER}: optimizer must be a name or an optimizer class, got "
                            f"{type(optimizer).__name__}")
        self.optimizer = OPTIMIZERS[optimizer.lower()] if isinstance(optimizer, str) else optimizer
        self.loss_fn = F.cross_entropy if loss_fn is None else loss_fn
        unknown = sorted(set(settings) - _CONFIG_FIELDS)
        if unknown:
            raise TypeError(f"{OWNER}: unknown setting(s) {unknown}; besides its own, it takes "
                            f"TrainingConfig's fields: {sorted(_CONFIG_FIELDS)}")
        if log_every_n_steps is not None:
            settings = dict(settings, log_interval=log_every_n_steps)
        # checked here, in this process, rather than by every worker
        self.config = TrainingConfig(**{
            "epochs": epochs, "mixed_precision": mixed_precision,
            "gradient_accumulation_steps": gradient_accumulation_steps,
            "zero_stage": zero_stage, "loss_scale": float(scaler_init_scale),
            "loss_scale_window": scaler_growth_interval, "seed": seed, **settings})
        if not isinstance(mlflow_tracking, bool):
            raise TypeError(f"{OWNER}: mlflow_tracking must be a bool, got {mlflow_tracking!r}")
        self.mlflow_tracking = mlflow_tracking
        self.tensorboard, self.tensorboard_dir = tensorboard_folder(
            tensorboard, tensorboard_dir, self.config.metrics_dir)
        self.find_unused_parameters = check_unused_parameters(find_unused_parameters,
                                                              zero_stage)
        self._announced = False

    def fit(self, train_data: Any, val_loader: Any = None,
            checkpoint_dir: Optional[str] = None, mlflow_experiment: Optional[str] = None) -> Any:
        """Train on ``train_data`` (a DataLoader or a Dataset) in ``num_gpus`` processes;
        rank 0's ``History`` (``total_time``, ``best_accuracy``, one record per epoch).
        ``mlflow_experiment``: the experiment of a new MLflow run, unless one is active here."""
        # Rank 0 records the run (``MLflowLogger``): into the run open in this process
        # (``with mlflow.start_run():`` around fit), else a new one in the experiment.
        callbacks = []
        if self.mlflow_tracking or mlflow_experiment is not None:
            callbacks.append(for_active_run(mlflow_experiment, f"{OWNER}.fit"))
        stop_main_import(f"{OWNER}.fit")  # a worker importing an unguarded script stops here
        if self.tensorboard:  # a new folder for each fit when none was given, as torch's
            from .tensorboard_logger import TensorBoardLogger
            callbacks.append(TensorBoardLogger(self.tensorboard_dir))
        config = self._fit_config(checkpoint_dir)
        recipe = DDPRecipe(self.model, self.optimizer, self.learning_rate, self.loss_fn,
                           config, self._loader(train_data), val_loader, callbacks,
                           self.find_unused_parameters, self.layout, self._join_backend)
        if self.num_processes == 1 or under_launcher():
            return recipe()[0]  # the model trained here, in place
        payload = pickle_recipe(recipe, {"model": self.model, "optimizer": self.optimizer,
                                         "loss_fn": self.loss_fn, "train_data": train_data,
                                         "val_loader": val_loader}, OWNER)
        self._announce()
        history, weights = run_in_processes(payload, self.num_processes, backend=self.backend,
                                            timeout=self.timeout, owner=f"{OWNER}.fit")
        if weights is not None:
            self.model.load_state_dict(weights)
        return history

    def _fit_config(self, checkpoint_dir: Optional[str]) -> TrainingConfig:
        """The TrainingConfig of this fit: ``checkpoint_dir`` (fit's, else the config's);
        epochs between checkpoints without a folder to keep them in are refused."""
        if checkpoint_dir is not None and self.checkpoint_dir is not None and (
                str(checkpoint_dir) != self.checkpoint_dir):
            raise ValueError(f"{OWNER}.fit: checkpoint_dir={str(checkpoint_dir)!r} and "
                             f"config.checkpoint_dir={self.checkpoint_dir!r} both set it; give "
                             f"it in one place")
        folder = checkpoint_dir if checkpoint_dir is not None else self.checkpoint_dir
        if folder is not None:
            return dataclasses.replace(self.config, checkpoint_dir=str(folder))
        if self.config.checkpoint_dir is None and self._epochs_setting is not None:
            raise ValueError(f"{OWNER}.fit: {self._epochs_setting}="
                             f"{self.config.save_every_epochs} has no effect without a "
                             f"checkpoint_dir (fit's or the config's)")
        return self.config

    def _loader(self, data: Any) -> Any:
        loader = per_process_loader(data, self.batch_size, f"{OWNER}.fit")
        if loader is not data and isinstance(data, DataLoader):
            step = self.batch_size * self.num_processes
            print(f"{OWNER}: the loader's batch_size={data.batch_size} is replaced by "
                  f"batch_size={self.batch_size} per process ({step} a step over "
                  f"{self.num_processes} processes)", flush=True)
        return loader

    def _announce(self) -> None:
        if self._announced:
            return
        self._announced = True
        from ..backends import cupy_backend
        # Said with a GPU too: this trainer keeps the model on the CPU, which a user asking
        # for num_gpus would not expect.
        where = ("a GPU is here, but this trainer runs its processes on the CPU"
                 if cupy_backend.is_available() else "no GPU here")
        print(f"{OWNER}: {where}: num_gpus={self.num_processes} starts "
              f"{self.num_processes} processes on the CPU ({self.backend} backend)", flush=True)


def per_process_loader(data: Any, batch_size: Optional[int], owner: str) -> Any:
    """A DataLoader of ``batch_size`` rows per process: a Dataset is wrapped (shuffled, 32 rows
    when no size is given), a plain DataLoader of another batch size rebuilt (the Trainer adds
    the DistributedSampler); ``data`` itself when it already fits."""
    if not isinstance(data, DataLoader):
        if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
            raise TypeError(f"{owner}: the training data must be a DataLoader or a Dataset, "
                            f"got {type(data).__name__}")
        return DataLoader(data, batch_size=batch_size or 32, shuffle=True)
    if batch_size is None or data.batch_size == batch_size:
        return data
    if data.sampler is not None:
        raise ValueError(f"{owner}: batch_size={batch_size} per process, but the loader "
                         f"(batch_size={data.batch_size}) has its own sampler and cannot be "
                         f"rebuilt; give it batch_size={batch_size}")
    return DataLoader(data.dataset, batch_size=batch_size, shuffle=data.shuffle,
                      drop_last=data.drop_last, collate_fn=data.collate_fn,
                      **data.worker_options())


# the keywords PyTorchDDPTrainer takes and their defaults (a DistributedConfig overrides them)
_DEFAULTS = {name: p.default for name, p in
             inspect.signature(PyTorchDDPTrainer.__init__).parameters.items()
             if p.default is not inspect.Parameter.empty and name != "config"}
