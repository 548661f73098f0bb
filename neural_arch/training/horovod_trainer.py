"""``HorovodTrainer``: a Horovod training script's loop in one object, on
``Trainer(strategy="horovod")``::

    trainer = HorovodTrainer(model, optimizer="adam", learning_rate=1e-3, batch_size=32,
                             epochs=5, compression=hvd.Compression.fp16)
    history = trainer.fit(train_loader, val_loader, checkpoint_dir="./checkpoints")
    print(metric_average(history.best_accuracy, "best_accuracy"))

As in a Horovod script, every process runs it: start N of them with
``python -m neural_arch.horovod.run -np N python train.py`` (alone, it is a job of one).
``fit`` joins the job with ``hvd.init()`` (the group stays until ``hvd.shutdown()``, so
``metric_average`` works after it), builds the optimizer over this rank's model and trains it
with the "horovod" strategy: rank 0's weights and optimizer state broadcast, gradients
averaged by ``hvd.DistributedOptimizer`` with ``compression``, the data split over the ranks.
``batch_size`` is per process, so a step sees ``size() * batch_size`` samples; the other
settings are ``TrainingConfig``'s fields (``scale_lr=True``: lr times the ranks).
``PyTorchDDPTrainer`` is the sister spelling that starts its processes itself.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

import numpy as np

from .. import functional as F
from .. import horovod as hvd
from .config import TrainingConfig
from .ddp_trainer import OPTIMIZERS, per_process_loader
from .strategies.horovod import HorovodStrategy, join_horovod

OWNER = "HorovodTrainer"
_CONFIG_FIELDS = {f.name for f in dataclasses.fields(TrainingConfig)}


def metric_average(value: Any, name: str) -> float:
    """``value`` (a scalar) averaged over every rank: Horovod's example helper, an
    ``hvd.allreduce`` matched by ``name`` on every rank."""
    arr = np.asarray(value.array if hasattr(value, "array") else value, dtype=np.float64)
    if arr.size != 1:
        raise ValueError(f"metric_average({name!r}) averages a scalar, got shape {arr.shape}")
    join_horovod()
    return float(hvd.allreduce(arr.reshape(1), op=hvd.Average, name=name)[0])


class HorovodTrainer:
    def __init__(self, model: Any, optimizer: Any = "adam", learning_rate: float = 1e-3,
                 batch_size: Optional[int] = None, epochs: int = 1, loss_fn: Any = None,
                 compression: Any = hvd.Compression.none, op: Any = hvd.Average,
                 gradient_predivide_factor: float = 1.0,
                 optimizer_options: Optional[Dict[str, Any]] = None, **config: Any) -> None:
        if isinstance(optimizer, str) and optimizer.lower() not in OPTIMIZERS:
            raise ValueError(f"{OWNER}: optimizer={optimizer!r} is none of {sorted(OPTIMIZERS)}; "
                             f"or pass an optimizer class, called as cls(params, lr=...)")
        if isinstance(optimizer, str):
            optimizer = OPTIMIZERS[optimizer.lower()]
        if not isinstance(optimizer, type):
            raise TypeError(f"{OWNER}: optimizer must be a name or an optimizer class (built "
                            f"here over the model: cls(params, lr=learning_rate, "
                            f"**optimizer_options)), got {type(optimizer).__name__}")
        if batch_size is not None and (isinstance(batch_size, bool) or not isinstance(
                batch_size, int) or batch_size < 1):
            raise ValueError(f"{OWNER}: batch_size must be a positive integer (per process), "
                             f"got {batch_size!r}")
        unknown = sorted(set(config) - _CONFIG_FIELDS)
        if unknown:
            raise TypeError(f"{OWNER}: unknown setting(s) {unknown}; besides its own, it takes "
                            f"TrainingConfig's fields: {sorted(_CONFIG_FIELDS)}")
        self.model, self.optimizer, self.batch_size = model, optimizer, batch_size
        self.learning_rate = float(learning_rate)
        self.optimizer_options = dict(optimizer_options or {})
        self.loss_fn = F.cross_entropy if loss_fn is None else loss_fn
        # for HorovodStrategy; hvd.DistributedOptimizer checks them at fit()
        self.strategy_options = {"compression": compression, "op": op,
                                 "gradient_predivide_factor": gradient_predivide_factor}
        self.config = TrainingConfig(**{"epochs": epochs, **config})
        self.trainer: Any = None  # the last fit's Trainer

    def fit(self, train_loader: Any, val_loader: Any = None,
            checkpoint_dir: Optional[str] = None) -> Any:
        """Train this rank's model on its share of ``train_loader`` (a DataLoader or a
        Dataset); the ``History`` (the same on every rank)."""
        from .trainer import Trainer
        config = self.config
        if checkpoint_dir is not None:
            config = dataclasses.replace(config, checkpoint_dir=str(checkpoint_dir))
        join_horovod()
        optimizer = self.optimizer(self.model.parameters(), lr=self.learning_rate,
                                   **self.optimizer_options)
        self.trainer = Trainer(self.model, optimizer, self.loss_fn, config,
                               strategy=HorovodStrategy(**self.strategy_options))
        return self.trainer.fit(per_process_loader(train_loader, self.batch_size,
                                                   f"{OWNER}.fit"), val_loader)

    def __repr__(self) -> str:
        return (f"{OWNER}({type(self.model).__name__}, optimizer={self.optimizer.__name__}, "
                f"learning_rate={self.learning_rate}, batch_size={self.batch_size})")
