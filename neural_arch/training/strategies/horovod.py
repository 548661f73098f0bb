"""``HorovodStrategy`` ("horovod"): data parallelism through the Horovod-style API.

Every rank holds the whole model. At set-up rank 0's parameters (and buffers) and optimizer
state are broadcast (``hvd.broadcast_parameters``, ``hvd.broadcast_optimizer_state``), so the
replicas start equal whatever each rank built; the optimizer becomes an
``hvd.DistributedOptimizer`` naming the model's parameters, whose gradient hooks start each
all-reduce during backward. Accumulation is its ``backward_passes_per_step``: the loss of each
of the k micro-batches is divided by k, and a parameter's all-reduce starts on its k-th
backward. Clipping follows Horovod's pattern: ``synchronize()`` (the averages are in
``.grad``), clip by the global norm (the same on every rank, so all clip alike), then
``step()`` inside ``skip_synchronize()``. The loop's metric sums go through ``hvd.allreduce``.

Horovod's operations run on every rank of the job, so the data group is the whole world.
Not supported: float16 mixed precision, ZeRO stages (``zero_stage`` other than 0).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable, Optional, Tuple

import numpy as np

from ... import horovod as hvd
from ...distributed import ReduceOp, get_rank, get_world_size, is_initialized
from ..batches import batch_size_of, forward
from .base import StepOutcome, Strategy
from .checkpoints import ManagerCheckpoints


def join_horovod() -> None:
    """``hvd.init()``: adopts the process group there is (else makes the job's); a layout left
    from an earlier group that is gone, or of another shape, is dropped first."""
    if hvd.is_initialized() and (not is_initialized() or (hvd.rank(), hvd.size()) != (
            get_rank(), get_world_size())):
        hvd.shutdown()
    hvd.init()


class HorovodStrategy(Strategy):
    name = "horovod"

    def __init__(self, compression: Any = hvd.Compression.none, op: Any = hvd.Average,
                 gradient_predivide_factor: float = 1.0) -> None:
        super().__init__()
        self.compression, self.op = compression, op
        self.gradient_predivide_factor = float(gradient_predivide_factor)
        self._window = 1          # micro-batches per optimizer step
        self._micro = 0           # micro-batches of the current window done
        self._max_norm: Optional[float] = None
        self._norm: Optional[float] = None
        self._comm_ms = 0.0
        self._steps = 0           # optimizer steps taken

    def setup(self, model: Any, optimizer: Any, config: Any, group: Any = None) -> None:
        unsupported = {"zero_stage": config.zero_stage != 0,
                       "mixed_precision": bool(config.mixed_precision)}
        for field, refused in unsupported.items():
            if refused:
                raise ValueError(f"strategy 'horovod' does not support TrainingConfig.{field}="
                                 f"{getattr(config, field)!r}; use 'ddp', 'zero1' or 'fsdp'")
        if group is not None and get_world_size(group) != get_world_size():
            raise ValueError(f"strategy 'horovod' runs on every rank of the job "
                             f"({get_world_size()}), but group has {get_world_size(group)} "
                             f"ranks; leave group=None")
        join_horovod()
        self.model, self.group = model, None
        hvd.broadcast_parameters(model, root_rank=0)
        hvd.broadcast_optimizer_state(optimizer, root_rank=0)
        self._window = config.gradient_accumulation_steps
        self._max_norm = config.max_grad_norm
        self.optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=self.compression, backward_passes_per_step=self._window, op=self.op,
            gradient_predivide_factor=self.gradient_predivide_factor)
        self.scale_learning_rate(config)

    # ------------------------------------------------------------------ steps
    def training_step(self, batch: Any, loss_fn: Optional[Callable]) -> StepOutcome:
        _, loss, _ = forward(self.model, batch, loss_fn)
        # each micro-batch's share of the window's mean: k backward passes sum to it
        loss.backward(np.full(loss.shape, 1.0 / self._window, dtype=loss.array.dtype))
        self._micro += 1
        outcome = StepOutcome(float(loss.item()), batch_size_of(batch), False)
        if self._micro < self._window:
            return outcome
        self._micro = 0
        start = time.perf_counter()
        self.optimizer.synchronize()  # waits for the all-reduces backward started
        self._comm_ms += (time.perf_counter() - start) * 1e3
        grads = [p.grad.array for p in self.model.parameters() if p.grad is not None]
        norm = math.sqrt(sum(float(np.sum(np.square(g, dtype=np.float64))) for g in grads))
        if not math.isfinite(norm):
            # no loss scaling runs here, so this is divergence, not an fp16 overflow to skip
            raise RuntimeError(f"strategy 'horovod': the averaged gradients' global norm is "
                               f"{norm} (not finite) at optimizer step {self._steps + 1}; "
                               f"lower the learning rate")
        self._norm = norm
        if self._max_norm is not None and self._max_norm / (norm + 1e-6) < 1.0:
            for g in grads:  # clip_grad_norm_'s rule, as the other strategies clip
                g *= self._max_norm / (norm + 1e-6)
        with self.optimizer.skip_synchronize():
            self.optimizer.step()
        self.optimizer.zero_grad()
        self._steps += 1
        return outcome._replace(stepped=True)

    def evaluation_step(self, batch: Any,
                        loss_fn: Optional[Callable]) -> Tuple[Any, float, Any]:
        output, loss, target = forward(self.model, batch, loss_fn)
        return output, float(loss.item()), target

    @property
    def grad_norm(self) -> Optional[float]:
        return self._norm

    def comm_ms(self) -> Optional[float]:
        """The time steps waited in ``synchronize()`` for gradients after backward."""
        return self._comm_ms

    # ------------------------------------------------------------------ collectives
    def reduce(self, values: np.ndarray, op: Any = ReduceOp.SUM) -> np.ndarray:
        if op != ReduceOp.SUM:
            return super().reduce(values, op)
        values[...] = hvd.allreduce(values, op=hvd.Sum)
        return values

    # ------------------------------------------------------------------ checkpoints
    def checkpoints(self, config: Any, resume_group: Any = None) -> ManagerCheckpoints:
        return ManagerCheckpoints(config.checkpoint_dir, config.max_checkpoints, self.model,
                                  self.optimizer, None, group=None, resume_group=resume_group)
