"""``Strategy``: the seam between the ``Trainer``'s loop and one parallel training step.

The loop (epochs, the schedule, records, validation, callbacks, checkpoints' timing, resume)
is the same for every kind of parallelism; what differs is behind this interface:

- ``setup(model, optimizer, config, group)``: wrap the model and the optimizer (DDP, FSDP's
  shards, a pipeline's stages), with the config's accumulation, clipping, precision, and
  ``scale_learning_rate(config)`` last (``scale_lr``);
- ``training_step(batch, loss_fn)``: forward, loss, backward, gradient sync, clipping and,
  at the end of an accumulation window, the optimizer step; ``StepOutcome`` says which;
- ``evaluation_step(batch, loss_fn)``: forward only, ``(output, loss, target)``;
- ``grad_norm`` (the last step's global norm, before clipping), ``comm_ms()`` (gradient
  communication the steps waited for so far, or None where it is not timed) and
  ``comm_hidden_ms()`` (what ran hidden under backward), for the records;
- ``data_group``: the ranks that split the data (the sampler's replicas) and over which the
  loop sums its metrics; ``is_global_zero``: whether this rank logs and writes;
- ``checkpoints(config, resume_group)``: what saves and restores the state the strategy
  holds (``checkpoints.ManagerCheckpoints`` for a module and optimizer; a pipeline's own);
- ``shard_loader``, ``train``/``eval``, ``reduce`` and ``barrier`` have defaults here.
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple, Optional, Tuple

import numpy as np

from ...distributed import ReduceOp, all_reduce, barrier, get_rank, get_world_size
from ..batches import shard_loader


class StepOutcome(NamedTuple):
    loss: float      # this micro-batch's loss (as the loop records it)
    samples: int     # rows of the batch this rank trained on
    stepped: bool    # the optimizer stepped (the end of an accumulation window)


class Strategy:
    """Base of every strategy; subclasses implement the methods that raise here."""

    name = "strategy"

    def __init__(self) -> None:
        self.model: Any = None
        self.optimizer: Any = None
        self.group: Any = None

    # ------------------------------------------------------------------ set-up
    def setup(self, model: Any, optimizer: Any, config: Any, group: Any = None) -> None:
        raise NotImplementedError(f"{type(self).__name__}.setup")

    def scale_learning_rate(self, config: Any) -> None:
        """``TrainingConfig(scale_lr=True)``: every param group's lr times the data-parallel
        ranks (the linear scaling rule, Goyal et al.: N ranks step on an N times larger
        batch). A ``setup`` calls it once, last, on the optimizer it will step."""
        if not getattr(config, "scale_lr", False):
            return
        ranks, groups = self.data_world, self.optimizer.param_groups
        before = groups[0]["lr"]
        for param_group in groups:
            param_group["lr"] = param_group["lr"] * ranks
        if self.is_global_zero and config.verbose:
            print(f"scale_lr: lr {before:g} x {ranks} data-parallel ranks = "
                  f"{groups[0]['lr']:g}", flush=True)

    @property
    def data_group(self) -> Any:
        """The group whose ranks each read a different share of the data (None: the world)."""
        return self.group

    @property
    def data_rank(self) -> int:
        return get_rank(self.data_group)

    @property
    def data_world(self) -> int:
        return get_world_size(self.data_group)

    @property
    def is_global_zero(self) -> bool:
        """The job's rank 0 logs, prints and writes the metrics."""
        return get_rank() == 0

    def shard_loader(self, loader: Any, shuffle: Optional[bool], seed: int) -> Any:
        """``loader`` reading this rank's share of the data (see ``batches.shard_loader``)."""
        return shard_loader(loader, self.data_world, self.data_rank, shuffle, seed)

    # ------------------------------------------------------------------ steps
    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def training_step(self, batch: Any, loss_fn: Optional[Callable]) -> StepOutcome:
        raise NotImplementedError(f"{type(self).__name__}.training_step")

    def evaluation_step(self, batch: Any,
                        loss_fn: Optional[Callable]) -> Tuple[Any, float, Any]:
        raise NotImplementedError(f"{type(self).__name__}.evaluation_step")

    @property
    def grad_norm(self) -> Optional[float]:
        raise NotImplementedError(f"{type(self).__name__}.grad_norm")

    def comm_ms(self) -> Optional[float]:
        """Milliseconds of gradient communication so far that the step waited for (None: not
        timed)."""
        return None

    def comm_hidden_ms(self) -> Optional[float]:
        """Milliseconds of gradient communication so far that ran hidden under backward, on
        the communication thread while backward computed (None: not timed)."""
        return None

    # ------------------------------------------------------------------ collectives
    def reduce(self, values: np.ndarray, op: Any = ReduceOp.SUM) -> np.ndarray:
        """``values`` reduced in place over the data group (the loop's metric sums)."""
        all_reduce(values, op, group=self.data_group)
        return values

    def barrier(self) -> None:
        barrier(group=self.data_group)

    # ------------------------------------------------------------------ checkpoints
    def checkpoints(self, config: Any, resume_group: Any = None) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.checkpoints")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
