"""``Trainer(..., num_processes=N)``: what the Trainer hands to ``run_in_processes`` when it is
asked to start its own workers.

The parent's Trainer does not join a job or wrap anything: it keeps its arguments, and at
``fit`` every worker builds the same Trainer from them (joining the job the launcher made for
it) and fits. Rank 0's History comes back, with its trained weights when every rank holds the
whole model (strategies that do not shard it), loaded into the parent's model, so the model
after ``fit`` is the trained one, as after a ``fit`` in this process.
"""
from __future__ import annotations

from typing import Any, Dict, Tuple

from ...nn.module_state import state_dict_copy

# Strategies whose every rank holds the whole model: its weights can come back from rank 0.
_WHOLE_MODEL = ("single", "ddp", "zero1", "horovod")


class TrainerRecipe:
    """Builds the Trainer in a worker from the parent's arguments and fits; returns
    (History, rank 0's weights or None)."""

    def __init__(self, args: Tuple[Any, ...], kwargs: Dict[str, Any], train_loader: Any,
                 val_loader: Any, fit_kwargs: Dict[str, Any]) -> None:
        self.args, self.kwargs = args, kwargs
        self.train_loader, self.val_loader, self.fit_kwargs = (train_loader, val_loader,
                                                               fit_kwargs)

    def __call__(self) -> Tuple[Any, Any]:
        from ..trainer import Trainer
        trainer = Trainer(*self.args, **self.kwargs)
        history = trainer.fit(self.train_loader, self.val_loader, **self.fit_kwargs)
        whole = trainer.strategy.name in _WHOLE_MODEL
        # a copy: the weights go back to the parent process after the model is gone
        return history, (state_dict_copy(trainer.model) if whole else None)

    def parts(self) -> Dict[str, Any]:
        """Each piece by name, so that one that cannot be pickled is named."""
        names = ("model", "optimizer", "loss_fn", "config", "callbacks", "scheduler")
        return {**dict(zip(names, self.args)), **self.kwargs, "train_loader": self.train_loader,
                "val_loader": self.val_loader, **self.fit_kwargs}

    def __repr__(self) -> str:
        return f"TrainerRecipe({type(self.args[0]).__name__})"
