"""``Pipeline`` ("pipeline"): a ``GPT3D`` on a (dp, tp, pp) device mesh, each rank one stage
(or, interleaved, a few chunks) of the model, split over its tp group.

The step is ``GPT3D.train_step``: the schedule (GPipe, 1F1B or interleaved 1F1B) runs the
micro-batches through the stages over the pp group, the gradients are averaged over dp (DDP's
buckets during the last backward), the whole model's norm is taken and clipped by, and the
optimizer (ZeRO-1 when the model was built with ``data_parallel="zero1"``) steps. The data is
split over the dp group: each replica's loader gives its own rows, which the step runs as that
replica's slice of the global batch. The loss returned is the global batch's mean, on every
rank; the model computes its own (vocabulary-parallel) loss, so there is no ``loss_fn``.
In evaluation the last stage's ranks return their logits (their replica's rows, their shard of
the vocabulary) and ``predicted_tokens`` takes the argmax over the tp group; the other stages
count nothing, and ``reduce`` sends the last stage's sums (over dp) along the pipeline, as the
loss is sent.

A data-parallel loader's short last batch is used only when its rows still split into the
micro-batches; otherwise the epoch ends without it. Not supported: gradient accumulation
(more micro-batches do its work), float16 mixed precision, ZeRO stages 2 and 3.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Tuple

import numpy as np

from ...distributed import ReduceOp, broadcast
from ...distributed.tensor_parallel.argmax import vocab_parallel_argmax
from .base import StepOutcome, Strategy
from .pipeline_checkpoints import PipelineCheckpoints


def _array(value: Any) -> np.ndarray:
    return np.asarray(value.array if hasattr(value, "array") and not isinstance(
        value, np.ndarray) else value)


class Pipeline(Strategy):
    name = "pipeline"

    def setup(self, model: Any, optimizer: Any, config: Any, group: Any = None) -> None:
        if not all(hasattr(model, name) for name in ("train_step", "evaluate", "dp_group")):
            raise TypeError(f"strategy 'pipeline' trains a GPT3D (neural_arch.distributed."
                            f"parallel3d), got {type(model).__name__}")
        if optimizer is not None and optimizer is not model.optimizer:
            raise ValueError("strategy 'pipeline': the GPT3D holds its own optimizer (over "
                             "this rank's stage); pass model.optimizer or None")
        unsupported = {"gradient_accumulation_steps": config.gradient_accumulation_steps != 1,
                       "mixed_precision": bool(config.mixed_precision),
                       "zero_stage": config.zero_stage not in (0, 1)}
        for name, refused in unsupported.items():
            if refused:
                raise ValueError(f"strategy 'pipeline' does not support TrainingConfig.{name}="
                                 f"{getattr(config, name)!r}")
        if config.zero_stage == 1 and model.data_parallel != "zero1":
            raise ValueError(f"TrainingConfig.zero_stage=1, but the GPT3D was built with "
                             f"data_parallel={model.data_parallel!r}; build it with 'zero1'")
        if group is not None and group is not model.dp_group:
            raise ValueError("strategy 'pipeline' splits the data over the GPT3D's dp group; "
                             "leave group=None")
        model.max_grad_norm = config.max_grad_norm  # the config decides, as for every strategy
        self.model, self.optimizer, self.group = model, model.optimizer, model.dp_group
        self.scale_learning_rate(config)  # each stage's optimizer, times the dp ranks

    def shard_loader(self, loader: Any, shuffle: Optional[bool], seed: int) -> Any:
        return _WholeMicroBatches.wrap(super().shard_loader(loader, shuffle, seed),
                                       self.model.n_microbatches)

    def train(self) -> None:
        """Nothing to do: ``evaluate`` switches the stages to eval mode and back itself."""

    def eval(self) -> None:
        """See ``train``."""

    def _global_batch(self, batch: Any, loss_fn: Optional[Callable]) -> Tuple[Any, Any]:
        """GPT3D's steps take the global batch and keep replica ``dp_rank``'s slice of it.
        This replica's rows stand in every slot: the other slots are never read."""
        if loss_fn is not None:
            raise ValueError("strategy 'pipeline': the GPT3D computes its own loss (vocabulary-"
                             "parallel cross-entropy); pass loss_fn=None")
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise ValueError(f"strategy 'pipeline' expects batches (idx, targets), got "
                             f"{type(batch).__name__}")
        replicas = self.model.dp
        return tuple(np.concatenate([_array(part)] * replicas) if replicas > 1
                     else _array(part) for part in batch)

    def training_step(self, batch: Any, loss_fn: Optional[Callable]) -> StepOutcome:
        idx, targets = self._global_batch(batch, loss_fn)
        loss = self.model.train_step(idx, targets)
        return StepOutcome(float(loss), idx.shape[0] // self.model.dp, True)

    def evaluation_step(self, batch: Any,
                        loss_fn: Optional[Callable]) -> Tuple[Any, float, Any]:
        logits: List[Any] = []
        loss = float(self.model.evaluate(*self._global_batch(batch, loss_fn), logits=logits))
        if not logits:  # not the last stage: no predictions here
            return None, loss, None
        # the logits are this replica's rows: its own targets, not the global batch's
        return logits[-1], loss, _array(batch[1])

    def predicted_tokens(self, logits: Any) -> Any:
        """The argmax over the whole vocabulary of the last stage's shard ``logits`` (B, T,
        V/tp); collective over its tp group, whose ranks all hold the same rows."""
        return vocab_parallel_argmax(logits, self.model.tp_group)

    def reduce(self, values: np.ndarray, op: Any = ReduceOp.SUM) -> np.ndarray:
        """Over dp, then the last stage's values sent along the pipeline: only it counts the
        predictions (the loss sums are the same on every stage already)."""
        super().reduce(values, op)
        pp_group = self.model.pp_group
        broadcast(values, src=pp_group.ranks[-1], group=pp_group)
        return values

    @property
    def grad_norm(self) -> Optional[float]:
        return self.model.grad_norm

    def checkpoints(self, config: Any, resume_group: Any = None) -> PipelineCheckpoints:
        return PipelineCheckpoints(config.checkpoint_dir, self.model, config.max_checkpoints)


class _WholeMicroBatches:
    """``loader`` without its short last batch when that batch's rows do not split into
    ``microbatches``; ``sampler`` and ``len`` as the loop expects them."""

    def __init__(self, loader: Any, length: int) -> None:
        self.loader, self.length = loader, length
        self.sampler = getattr(loader, "sampler", None)

    @classmethod
    def wrap(cls, loader: Any, microbatches: int) -> Any:
        size = getattr(loader, "batch_size", None)
        if size is None or getattr(loader, "drop_last", False):
            return loader
        sampler = getattr(loader, "sampler", None)
        rows = len(sampler) if sampler is not None else len(loader.dataset)
        rest = rows % size
        if not rest or rest % microbatches == 0:
            return loader
        return cls(loader, len(loader) - 1)

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Any]:
        for index, batch in enumerate(self.loader):
            if index >= self.length:
                return
            yield batch
