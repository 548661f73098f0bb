"""``RayTrainer(model, config)``: the model-first spelling, mapped onto ``RayTrainer``.

    trainer = RayTrainer(model, config)          # config: the trial's hyperparameters
    trainer.fit(train_loader, val_loader)
    trainer.best_accuracy, trainer.history, trainer.result

``fit`` runs a ``RayTrainer`` whose loop trains a copy of ``model`` with the project's
``Trainer`` on every worker (classification: cross-entropy), and loads worker 0's trained
weights back into ``model``. From ``config`` it takes ``lr`` (default 0.01), ``optimizer``
("sgd", "adam" or "adamw"; default "adam"), ``momentum`` (SGD), ``weight_decay``, ``epochs``
(default 1), ``batch_size`` (the training loader is rebatched to it, per worker) and
``num_workers`` (default 1); any other key is the caller's (``hidden_size`` built the model)
and is left alone. What this spelling cannot express raises a ValueError or TypeError naming
it: another loss, a scheduler, a loader that is not a ``DataLoader``.
"""
from __future__ import annotations

import os
import pickle
import secrets
import tempfile
import time
from typing import Any, Dict, List, Optional

from .checkpoint import Checkpoint
from .config import RunConfig, ScalingConfig
from .session import get_context, report
from .trainer import RayTrainer

OPTIMIZERS = ("sgd", "adam", "adamw")
WEIGHTS_FILE = "model.pt"


def _number(config: Dict[str, Any], key: str, default: Any, integer: bool = False,
            zero_ok: bool = False) -> Any:
    value = config.get(key, default)
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or value < 0 \
            or (value == 0 and not zero_ok):
        what = "a positive integer" if integer else \
            ("a number >= 0" if zero_ok else "a number > 0")
        raise ValueError(f"RayTrainer(model, config): config[{key!r}] must be {what}, got "
                         f"{value!r}")
    return value


def _optimizer(name: str, parameters: Any, config: Dict[str, Any]) -> Any:
    from ..optim import SGD, Adam, AdamW
    lr = _number(config, "lr", 0.01)
    decay = _number(config, "weight_decay", 0.0, zero_ok=True)
    if name == "sgd":
        return SGD(parameters, lr=lr, momentum=_number(config, "momentum", 0.0, zero_ok=True),
                   weight_decay=decay)
    return (Adam if name == "adam" else AdamW)(parameters, lr=lr, weight_decay=decay)


def train_model(packed: Dict[str, bytes]) -> None:
    """The loop on every worker: the model trained by the Trainer; worker 0 reports the
    history and its trained weights. The parts travel pickled: arrays Ray hands over itself
    arrive read-only, and the optimizer updates the weights in place."""
    import neural_arch.functional as F
    from ..data import DataLoader
    from ..serialization import save
    from ..training import Trainer, TrainingConfig
    parts = pickle.loads(packed["parts"])
    config, model = parts["config"], parts["model"]
    world = get_context().get_world_size()
    train = parts["train_loader"]
    batch = config.get("batch_size")
    if batch is not None or world > 1:  # each worker its share of a step's batch
        size = max(1, int(batch or train.batch_size) // world)
        train = DataLoader(train.dataset, batch_size=size, shuffle=True, seed=config.get("seed"))
    trainer = Trainer(model, _optimizer(parts["optimizer"], model.parameters(), config),
                      F.cross_entropy,
                      TrainingConfig(epochs=parts["epochs"], verbose=False, progress_bar=False))
    history = trainer.fit(train, parts["val_loader"])
    records = [dict(record) for record in history.epochs]
    with tempfile.TemporaryDirectory() as folder:
        if get_context().get_world_rank() == 0:
            save(model.state_dict(), os.path.join(folder, WEIGHTS_FILE))
        report({"history": records}, checkpoint=Checkpoint.from_directory(folder))


def _default_run_config() -> RunConfig:
    """A run of its own (trials start these side by side), in the trial's directory when
    this runs inside a tuner's trial."""
    from ..tune import session as tune_session
    name = f"RayTrainer_{time.strftime('%Y-%m-%d_%H-%M-%S')}_{os.getpid()}_{secrets.token_hex(3)}"
    inside = tune_session._context
    return RunConfig(name=name, storage_path=inside.directory if inside is not None else None)


class ModelRayTrainer(RayTrainer):
    def __init__(self, model: Any, config: Optional[Dict[str, Any]] = None, *,
                 scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None, address: Optional[str] = None) -> None:
        from ..nn import Module
        if not isinstance(model, Module):
            raise TypeError(f"RayTrainer(model, config): model must be a neural_arch Module, "
                            f"got {type(model).__name__}")
        config = {} if config is None else config
        if not isinstance(config, dict):
            raise TypeError(f"RayTrainer(model, config): config must be a dict, got "
                            f"{type(config).__name__}")
        for key in ("loss", "loss_fn", "scheduler", "lr_scheduler"):
            if key in config:
                raise ValueError(f"RayTrainer(model, config): config[{key!r}] cannot be "
                                 f"mapped (cross-entropy, a constant lr); write a training "
                                 f"loop: RayTrainer(train_loop_per_worker, ...)")
        self.optimizer_name = str(config.get("optimizer", "adam")).lower()
        if self.optimizer_name not in OPTIMIZERS:
            raise ValueError(f"RayTrainer(model, config): config['optimizer'] must be one of "
                             f"{list(OPTIMIZERS)}, got {config.get('optimizer')!r}")
        self.epochs = _number(config, "epochs", 1, integer=True)
        workers = _number(config, "num_workers", 1, integer=True)
        _number(config, "lr", 0.01)  # checked now rather than on the workers
        self.model, self.config = model, dict(config)
        super().__init__(train_model, scaling_config=scaling_config or ScalingConfig(workers),
                         run_config=run_config or _default_run_config(), address=address)
        self.history: List[Dict[str, Any]] = []
        self.result: Any = None

    def fit(self, train_loader: Any = None,  # type: ignore[override]
            val_loader: Any = None) -> Any:
        from ..data import DataLoader
        from ..serialization import load
        for name, loader in (("train_loader", train_loader), ("val_loader", val_loader)):
            if loader is not None and not isinstance(loader, DataLoader):
                raise TypeError(f"RayTrainer(model, config).fit: {name} must be a "
                                f"neural_arch DataLoader, got {type(loader).__name__}")
        if train_loader is None:
            raise ValueError("RayTrainer(model, config).fit: train_loader is needed")
        self.loop_config = {"parts": pickle.dumps({
            "model": self.model, "config": self.config, "optimizer": self.optimizer_name,
            "epochs": self.epochs, "train_loader": train_loader, "val_loader": val_loader})}
        self.result = super().fit()
        self.history = list(self.result.metrics["history"])
        with self.result.checkpoint.as_directory() as folder:
            self.model.load_state_dict(load(os.path.join(folder, WEIGHTS_FILE)))
        return self.result

    @property
    def best_accuracy(self) -> Optional[float]:
        """The best validation accuracy of any epoch (None without validation data)."""
        values = [r["val_accuracy"] for r in self.history if r.get("val_accuracy") is not None]
        return max(values) if values else None
