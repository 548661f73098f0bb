"""``DistributedTrainer`` and ``setup_distributed_training``: the TabGPT guide's trainer, run
by the project's ``Trainer``.

``train()`` builds a ``Trainer`` on ``TabularTrainingModule(model)`` with ``AdamW``, the
strategy and config that ``mapping.plan`` made of the two configs, and a
``DistributedTrainingMonitor`` when ``monitor_communication`` is on. Under a launcher (or after
``init_process_group``) the job's ranks train; outside a job with ``world_size=N > 1`` the
Trainer starts N worker processes itself (``Trainer(num_processes=N)``, docs/self-launch.md),
and the trained weights come back into ``model`` (ZeRO stages 0 and 1, where every rank holds
the whole model). Each rank reads ``batch_size`` rows per step; the global batch is
``batch_size x ranks x gradient_accumulation_steps``.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Optional

from ...data import DataLoader
from ...optim import AdamW
from ...training import Callback, History, Trainer
from .configs import DistributedConfig, TrainingConfig
from .mapping import plan
from .monitor import STATISTICS_FILE, DistributedTrainingMonitor
from .rows import TabularTrainingModule, TrainerRows

__all__ = ["DistributedTrainer", "setup_distributed_training"]

_FLOAT16_EXACT = 2048  # integers float16 holds exactly: category codes under mixed precision


def _dataset_of(loader: Any, what: str) -> Any:
    if loader is None or not isinstance(loader, DataLoader):
        return loader
    if loader.sampler is not None:
        raise ValueError(f"{what}: the trainer splits the rows over the ranks itself; pass a "
                         f"DataLoader without a sampler (or the dataset)")
    return loader.dataset


class DistributedTrainer:
    """``train()`` returns the ``History``; ``monitor`` holds the measured statistics."""

    def __init__(self, model: Any, config: TrainingConfig, distributed_config: DistributedConfig,
                 train_dataloader: Any = None, eval_dataloader: Any = None,
                 train_dataset: Any = None, eval_dataset: Any = None,
                 monitor: Optional[DistributedTrainingMonitor] = None) -> None:
        self.plan = plan(config, distributed_config)  # every field checked here, before data
        self.model, self.config, self.distributed_config = model, config, distributed_config
        self.module = TabularTrainingModule(model)
        train_data = train_dataset if train_dataset is not None else _dataset_of(
            train_dataloader, "train_dataloader")
        if train_data is None:
            raise ValueError("DistributedTrainer needs train_dataloader (or train_dataset)")
        eval_data = eval_dataset if eval_dataset is not None else _dataset_of(
            eval_dataloader, "eval_dataloader")
        self.train_rows = TrainerRows(train_data, "train_dataset")
        self.eval_rows = None if eval_data is None else TrainerRows(eval_data, "eval_dataset")
        self._check_mixed_precision()
        if monitor is None and distributed_config.monitor_communication:
            monitor = DistributedTrainingMonitor(log_dir=config.output_dir)
        if monitor is not None and distributed_config.log_communication_stats:
            monitor.write_every_rank = True
        self.monitor = monitor
        self.trainer: Optional[Trainer] = None
        self.history: Optional[History] = None

    def _check_mixed_precision(self) -> None:
        cardinalities = getattr(self.model.config, "categorical_cardinalities", [])
        if self.plan.trainer_config.mixed_precision and any(
                c > _FLOAT16_EXACT for c in cardinalities):
            raise ValueError(f"TrainingConfig.use_mixed_precision=True: the rows travel to the "
                             f"model as float16, exact for category codes up to "
                             f"{_FLOAT16_EXACT}, and a column has "
                             f"{max(cardinalities)} categories")

    def _loaders(self) -> tuple:
        options = self.plan.loader_options
        train = DataLoader(self.train_rows, batch_size=self.plan.batch_size, shuffle=True,
                           **options)
        val = None if self.eval_rows is None else DataLoader(
            self.eval_rows, batch_size=self.plan.batch_size, **options)
        return train, val

    def _trainer(self, module: Any, num_processes: Optional[int]) -> Trainer:
        optimizer = AdamW(module.parameters(), lr=self.plan.learning_rate,
                          weight_decay=self.plan.weight_decay)
        callbacks = [] if self.monitor is None else [self.monitor]
        return Trainer(module, optimizer, None, self.plan.trainer_config, callbacks=callbacks,
                       backend=self.plan.backend, strategy=self.plan.strategy,
                       num_processes=num_processes)

    def train(self) -> History:
        self.trainer = self._trainer(self.module, self.plan.num_processes)
        train, val = self._loaders()
        try:
            self.history = self.trainer.fit(train, val)
        finally:
            if self.monitor is not None:
                self.monitor.stop_monitoring()  # also when fit raised
        spawned = getattr(self.trainer, "_spawn", None) is not None
        if spawned and self.monitor is not None and self.monitor.log_dir is not None:
            self.monitor.load_statistics(os.path.join(self.monitor.log_dir, STATISTICS_FILE))
        return self.history

    def measure_baseline(self, max_steps: int = 20) -> float:
        """The samples/s of this training in one process, on a copy of the model, for
        ``max_steps`` steps of the same global batch; becomes the monitor's baseline. Runs here,
        so only outside a job (under a launcher, give the monitor a measured number)."""
        from ...training.launching import under_launcher
        if under_launcher():
            raise RuntimeError("measure_baseline runs a one-process training here, which a "
                               "rank of a job cannot; pass baseline_samples_per_second to the "
                               "monitor, from a one-process run's statistics")
        ranks = self.plan.num_processes or 1
        module = TabularTrainingModule(copy.deepcopy(self.model))
        config = copy.copy(self.plan.trainer_config)
        config.max_steps, config.metrics_dir, config.checkpoint_dir = max_steps, None, None
        config.resume, config.save_interval, config.verbose = False, None, False
        config.log_interval = 1
        config.zero_stage = 0
        trainer = Trainer(module, AdamW(module.parameters(), lr=self.plan.learning_rate),
                          None, config)
        loader = DataLoader(self.train_rows, batch_size=self.plan.batch_size * ranks,
                            shuffle=True)
        records = []

        class _Rates(Callback):
            def on_step_end(self, _trainer: Any, logs: dict) -> None:
                if logs.get("samples_per_second") is not None and logs["step"] > 1:
                    records.append(logs["samples_per_second"])
        trainer.callbacks.append(_Rates())
        trainer.fit(loader)
        if not records:
            raise RuntimeError(f"measure_baseline: {max_steps} steps gave no timed interval; "
                               f"use max_steps of 3 or more")
        rate = sum(records) / len(records)
        if self.monitor is not None:
            self.monitor.set_baseline(rate)
        return rate

    def save_checkpoint(self, folder: Optional[str] = None) -> str:
        """The model as ``save_pretrained`` writes it, into ``output_dir/final`` by default."""
        folder = folder or os.path.join(self.config.output_dir, "final")
        self.model.save_pretrained(folder)
        return folder

    def cleanup(self) -> None:
        """Nothing is left to end: the Trainer ends the process group it joined when ``fit``
        returns, and a group the script made stays the script's."""
        if self.monitor is not None:
            self.monitor.stop_monitoring()


def setup_distributed_training(model: Any, train_dataset: Any, eval_dataset: Any = None,
                               training_config: Optional[TrainingConfig] = None,
                               distributed_config: Optional[DistributedConfig] = None
                               ) -> DistributedTrainer:
    """A ``DistributedTrainer`` over the two datasets; ``train()`` on it trains."""
    return DistributedTrainer(model, training_config or TrainingConfig(),
                              distributed_config or DistributedConfig(),
                              train_dataset=train_dataset, eval_dataset=eval_dataset)
