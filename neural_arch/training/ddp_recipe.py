"""``DDPRecipe``: what each worker of ``PyTorchDDPTrainer.fit`` runs (and the one process, when
there are no workers): the optimizer and ``Trainer`` around its copy of the model, then ``fit``."""
from __future__ import annotations

from typing import Any, Mapping, Optional, Sequence

from ..distributed import destroy_process_group
from ..nn.module_state import state_dict_copy
from .config import TrainingConfig


class DDPRecipe:
    """Returns (History, the weights when every rank holds the whole model, else None).
    ``callbacks``: the loggers (MLflow, TensorBoard); ``find_unused_parameters``: DDP's;
    ``layout``: the job shape a DistributedConfig asked for, checked on every rank first."""

    def __init__(self, model: Any, optimizer: Any, learning_rate: float, loss_fn: Any,
                 config: TrainingConfig, train_loader: Any, val_loader: Any,
                 callbacks: Sequence[Any] = (), find_unused_parameters: bool = False,
                 layout: Optional[Mapping[str, int]] = None, backend: str = "auto") -> None:
        self.model, self.optimizer, self.learning_rate = model, optimizer, learning_rate
        self.loss_fn, self.config = loss_fn, config
        self.train_loader, self.val_loader = train_loader, val_loader
        self.callbacks, self.find_unused_parameters = tuple(callbacks), find_unused_parameters
        self.layout, self.backend = dict(layout or {}), backend

    def __call__(self) -> tuple:
        from .ddp_settings import UnusedParametersDataParallel, check_job_layout
        from .joining import join_job
        from .trainer import Trainer
        # joined here rather than by the Trainer, so that the job's shape is checked first
        owns_group = join_job(self.backend, announce=self.config.verbose)
        try:
            check_job_layout(self.layout)
            optimizer = self.optimizer(self.model.parameters(), lr=self.learning_rate)
            strategy = UnusedParametersDataParallel() if self.find_unused_parameters else None
            trainer = Trainer(self.model, optimizer, self.loss_fn, self.config,
                              callbacks=self.callbacks, strategy=strategy)
            history = trainer.fit(self.train_loader, self.val_loader)
        finally:
            if owns_group:
                destroy_process_group()
        whole = self.config.zero_stage < 2
        # a copy: the weights go back to the parent process after the model is gone
        return history, (state_dict_copy(self.model) if whole else None)

    def __repr__(self) -> str:
        return f"DDPRecipe({type(self.model).__name__}, {self.config})"
