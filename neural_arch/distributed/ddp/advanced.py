"""``AdvancedDistributedDataParallel``: DDP plus gradient accumulation, clipping by the global
norm, overflow-safe steps, float16 mixed precision and communication statistics.

It composes a ``DistributedDataParallel`` (whose buckets do the all-reduce) and drives one
optimizer step per ``gradient_accumulation_steps`` calls of ``backward_step(loss, optimizer)``.
With ``overlap=True`` the buckets are all-reduced during the window's last backward (DDP's
automatic sync); by default after it, explicitly and timed. Both give the same gradients.

Mixed precision (``mixed_precision=True``): float16 compute, float32 master weights.
- The wrapped module's own parameters are the float32 masters: ``parameters()``, the
  optimizer, ``state_dict()`` and checkpoints all see float32 weights, so nothing needs
  converting on save or resume. Build the optimizer on ``wrapper.parameters()`` (the same
  objects as ``wrapper.module.parameters()``).
- ``forward`` casts the weights to float16 for the duration of the call (each parameter's
  ``.array`` is a float16 copy while the module runs, and is the master again afterwards), and
  casts floating inputs to float16, so the whole model computes in float16. Floating outputs
  come back as float32, so the loss and its softmax are computed in float32
  (``half_precision``).
- Backward runs through the float16 graph; each gradient lands on its parameter as float32
  (the engine stores a leaf's gradient in the leaf's dtype), so micro-batches accumulate in
  float32. DDP's float16 compression all-reduces them as float16, half the bytes.
- The loss is multiplied by the loss scale before backward; the float32 gradients are divided
  by it, checked for inf/NaN (any overflow of the float16 graph or all-reduce shows up here),
  clipped, and the optimizer updates the masters. The next forward casts the new weights.

ZeRO stage 1 (``zero_stage=1``): ``wrap_optimizer`` returns a ``ZeroRedundancyOptimizer``, so
each rank keeps the optimizer state of its share of the parameters only; gradients are still
averaged by the inner DDP, and the optimizer's step all-gathers the updated shares (3(N-1)/N
of the model per step). With ``reduce_scatter=True`` (the ``"zero1"`` strategy) there is no
DDP: ``wrap_optimizer`` returns a ``ReduceScatterZeroOptimizer``, the window's sync
reduce-scatters the gradients (``zero_sync``), the norm is summed over the ranks' shards, and
the step all-gathers the updated shards (2(N-1)/N). Stages 2
and 3 replace the inner DDP by ``FullyShardedDataParallel`` with ``SHARD_GRAD_OP`` and
``FULL_SHARD``: ``.module`` is then that wrapper (holding the model), ``parameters()`` are its
shards (build the optimizer on them, or use ``wrap_optimizer``), gradients are averaged into
the shards during backward, the global norm is summed over the shards, and mixed precision is
FSDP's (float16 compute and reduction, float32 shards) with this wrapper's loss scaler.
"""
from __future__ import annotations

import contextlib
import logging
import math
import time
from typing import Any, Dict, Optional

import numpy as np

from ...backends import xp_of
from ...core import Tensor
from ...nn import Module
from ...optim import Optimizer
from .. import collectives
from ..fsdp import FullyShardedDataParallel
from ..group.world import get_world_size
from ..optim import ReduceScatterZeroOptimizer, ZeroRedundancyOptimizer
from ..profiler import CommunicationProfiler
from ..reduce_ops import ReduceOp
from ..tensor_parallel.clip_grad import grad_norm, norm_parameters
from .data_parallel import DistributedDataParallel
from .half_precision import forward_in_float16, overflow_expected
from .loss_scaler import LossScaler
from .stage_optimizer import optimizer_for_stage
from .training_config import DistributedTrainingConfig
from .zero_sync import ReduceScatterSync

_LOG = logging.getLogger(__name__)
_FSDP_STRATEGY = {2: "SHARD_GRAD_OP", 3: "FULL_SHARD"}  # the stages FSDP implements


class AdvancedDistributedDataParallel(Module):
    """See the module docstring. ``.module`` is the wrapped model, ``.ddp`` the inner DDP,
    ``.scaler`` the ``LossScaler``, ``.profiler`` the ``CommunicationProfiler``."""

    def __init__(self, module: Module, config: Optional[DistributedTrainingConfig] = None,
                 group: Any = None, overlap: bool = False, reduce_scatter: bool = False) -> None:
        super().__init__()
        if not isinstance(module, Module):
            raise TypeError(f"AdvancedDistributedDataParallel wraps an nn.Module, got "
                            f"{type(module).__name__}")
        config = DistributedTrainingConfig() if config is None else config
        if not isinstance(config, DistributedTrainingConfig):
            raise TypeError(f"config must be a DistributedTrainingConfig, got "
                            f"{type(config).__name__}")
        self.config, self._group, self._mixed = config, group, config.mixed_precision
        self._sharded = config.zero_stage in _FSDP_STRATEGY
        self._reduce_scatter = bool(reduce_scatter)
        if self._reduce_scatter and config.zero_stage != 1:
            raise ValueError(f"reduce_scatter=True is ZeRO-1 by reduce-scatter; it needs "
                             f"zero_stage=1, got zero_stage={config.zero_stage}")
        # The global norm, the same on every rank: FSDP's shards are summed over the group; a
        # tensor-parallel model's share (a replicated parameter counted once) over its tp
        # group; DDP's averaged gradients are whole on every rank already.
        share, tp_group = norm_parameters(module)
        if tp_group is not None and tp_group.size > 1:
            if self._sharded or self._reduce_scatter:
                raise ValueError(f"zero_stage={config.zero_stage} shards parameters over the "
                                 "data-parallel group, which a model with tensor-parallel "
                                 "layers does not support; use zero_stage 0, or 1 with DDP")
            self._norm_share, self._norm_groups = share, (tp_group,)
        else:
            sharded = self._sharded or self._reduce_scatter
            self._norm_share, self._norm_groups = None, (group,) if sharded else ()
        if self._reduce_scatter:
            # no DDP: the optimizer reduce-scatters the gradients (see zero_sync)
            self.module = module
            object.__setattr__(self, "_ddp", ReduceScatterSync(module, group))
        elif self._sharded:
            # FSDP averages into the shards during backward; its shards are our parameters.
            self.module = FullyShardedDataParallel(
                module, process_group=group, sharding_strategy=_FSDP_STRATEGY[config.zero_stage],
                mixed_precision=self._mixed)
            object.__setattr__(self, "_ddp", self.module)
        else:
            self.module = module
            # overlap=False: backward_step synchronises once per window itself, so the whole
            # all-reduce is timed for the statistics. overlap=True: DDP's hooks launch each
            # bucket during the window's last backward, hiding communication behind it; the
            # statistics then time only what backward left to wait for (nothing, usually).
            ddp = DistributedDataParallel(module, bucket_size_mb=config.bucket_size_mb,
                                          group=group, gradient_compression=self._mixed,
                                          auto_sync=bool(overlap))
            object.__setattr__(self, "_ddp", ddp)  # unregistered: its parameters are ours
        self.scaler = LossScaler(config.loss_scale, growth_interval=config.loss_scale_window,
                                 min_scale=config.min_loss_scale,
                                 dynamic=config.dynamic_loss_scaling)
        self.profiler = CommunicationProfiler(enabled=config.profile_communication)
        self._world = get_world_size(group)
        trained = [p for p in module.parameters() if p.requires_grad]
        self._grad_bytes = sum(p.array.size * (2 if self._mixed else p.array.itemsize)
                               for p in trained)
        self._micro_in_window = 0
        self.step_count = self.micro_step_count = self.skipped_steps = 0
        self._norm_count, self._norm_sum, self._norm_max, self._norm_last = 0, 0.0, 0.0, 0.0
        self._comm_seconds, self._sync_count = 0.0, 0
        self._hidden_seconds = self._ddp_seen = self._hidden_seen = 0.0

    @property
    def ddp(self) -> Any:
        """The inner wrapper: a ``DistributedDataParallel``, or at zero_stage 2/3 the
        ``FullyShardedDataParallel``."""
        return self._ddp

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if not self._mixed or self._sharded:  # FSDP casts for itself
            return self._ddp(*args, **kwargs)
        return forward_in_float16(self.module, self._ddp, *args, **kwargs)

    def wrap_optimizer(self, optimizer: Any, **defaults: Any) -> Optimizer:
        """The optimizer to pass to ``backward_step``: with ``zero_stage=1`` a
        ``ZeroRedundancyOptimizer`` over this wrapper's group, else a plain one over
        ``self.parameters()`` (at zero_stage 2/3 the shards). ``optimizer`` is an ``Optimizer``
        class (built with ``defaults``) or an optimizer that has not stepped yet (rebuilt with
        its class, groups and defaults where it must be)."""
        return optimizer_for_stage(optimizer, defaults, self.config.zero_stage,
                                   list(self.parameters()), self._zero_optimizer)

    def _zero_optimizer(self, optimizer_class: type, params: Any,
                        defaults: Dict[str, Any]) -> Optimizer:
        if self._reduce_scatter:
            zero = ReduceScatterZeroOptimizer(params, optimizer_class, process_group=self._group,
                                              **defaults)
            self._ddp.optimizer = zero
            return zero
        return ZeroRedundancyOptimizer(params, optimizer_class, process_group=self._group,
                                       **defaults)

    # ------------------------------------------------------------------ training step
    def sync_gradients(self) -> None:
        """Average the gradients over the group now (timed and, if enabled, profiled). At
        zero_stage 2/3 backward has averaged them into the shards already."""
        if self._sharded:
            return
        # With overlap the buckets were averaged at the end of backward: what that waited for
        # is counted here, and what ran on the communication thread under backward is hidden.
        before = self._ddp.comm_stats()
        start = time.perf_counter()
        with self.profiler.profile_operation("gradient_sync", self._grad_bytes), self._quiet():
            self._ddp.sync_gradients()
        after = self._ddp.comm_stats()
        self._comm_seconds += time.perf_counter() - start + before["waited_s"] - self._ddp_seen
        self._hidden_seconds += after["hidden_s"] - self._hidden_seen
        self._ddp_seen, self._hidden_seen = after["waited_s"], after["hidden_s"]
        self._sync_count += 1

    def backward_step(self, loss: Tensor, optimizer: Any) -> bool:
        """Backward one micro-batch; at the end of each accumulation window synchronise, check
        for overflow, clip, step and zero the gradients. True when the optimizer stepped."""
        if not isinstance(loss, Tensor):
            raise TypeError(f"backward_step needs the loss Tensor, got {type(loss).__name__}")
        if loss.array.size != 1:
            raise ValueError(f"backward_step needs a scalar loss, got shape {loss.shape}")
        if not (hasattr(optimizer, "step") and hasattr(optimizer, "zero_grad")):
            raise TypeError(f"backward_step needs an optimizer with step() and zero_grad(), "
                            f"got {type(optimizer).__name__}")
        zero = ReduceScatterZeroOptimizer if self._reduce_scatter else ZeroRedundancyOptimizer
        if self.config.zero_stage == 1 and not isinstance(optimizer, zero):
            raise TypeError(f"zero_stage=1 shards the optimizer state: pass the optimizer "
                            f"returned by wrap_optimizer(), got a {type(optimizer).__name__}")
        steps = self.config.gradient_accumulation_steps
        factor = (self.scaler.scale_value if self._mixed else 1.0) / steps
        seed = xp_of(loss.array).full(loss.shape, factor, dtype=loss.dtype)
        self._micro_in_window += 1
        self.micro_step_count += 1
        with self._quiet():
            if self._micro_in_window < steps:
                with self._ddp.no_sync():
                    loss.backward(seed)
                return False
            loss.backward(seed)
        self._micro_in_window = 0
        return self._finish_window(optimizer)

    def _finish_window(self, optimizer: Any) -> bool:
        self.sync_gradients()
        # ZeRO-1 by reduce-scatter: each rank holds its shards' averaged gradients only
        stepped = (optimizer.shard_parameters() if self._reduce_scatter
                   else list(self.parameters()))
        grads = [p.grad.array for p in stepped if p.grad is not None]
        if self._mixed:
            self.scaler.unscale_(grads)
        norm = grad_norm(stepped, counted=self._norm_share, groups=self._norm_groups)
        # A float64 norm overflows only for absurd finite gradients: look closer before skipping.
        bad_here = not math.isfinite(norm) and (math.isnan(norm) or LossScaler.found_inf(grads))
        overflow = self._agree_on_overflow(bad_here)
        if self._mixed:
            self.scaler.update(overflow)
        if overflow:
            self.skipped_steps += 1
            self._zero_all(optimizer)
            return False
        max_norm = self.config.max_grad_norm
        # Every rank has the same norm (see __init__), so all clip alike.
        if max_norm is not None and max_norm / (norm + 1e-6) < 1.0:  # clip_grad_norm_'s rule
            for g in grads:
                g *= max_norm / (norm + 1e-6)
        self._record_norm(norm)
        optimizer.step()
        self._zero_all(optimizer)
        self.step_count += 1
        return True

    def _quiet(self) -> Any:
        return overflow_expected() if self._mixed else contextlib.nullcontext()

    def _agree_on_overflow(self, bad_here: bool) -> bool:
        """True on every rank when any rank saw inf/NaN, so that all skip the same steps."""
        flag = np.array([1 if bad_here else 0], dtype=np.int32)
        start = time.perf_counter()
        with self.profiler.profile_operation("overflow_check", flag.nbytes):
            collectives.all_reduce(flag, ReduceOp.MAX, group=self._group)
        self._comm_seconds += time.perf_counter() - start
        return bool(flag[0])

    def _zero_all(self, optimizer: Any) -> None:
        optimizer.zero_grad()
        self.zero_grad()

    def _record_norm(self, norm: float) -> None:
        self._norm_count += 1
        self._norm_sum += norm
        self._norm_max = max(self._norm_max, norm)
        self._norm_last = norm
        if self.config.log_gradient_norms:
            _LOG.info("step %d: gradient norm %.6g", self.step_count + 1, norm)

    # ------------------------------------------------------------------ reporting
    def get_statistics(self) -> Dict[str, Any]:
        count = self._norm_count
        return {
            "step_count": self.step_count, "micro_step_count": self.micro_step_count,
            "skipped_steps": self.skipped_steps,
            "gradient_norms": {"mean": self._norm_sum / count if count else 0.0,
                               "max": self._norm_max, "last": self._norm_last, "count": count},
            "communication_time_ms": {
                "total": self._comm_seconds * 1e3,
                "mean": self._comm_seconds * 1e3 / self._sync_count if self._sync_count else 0.0,
                "hidden": self._hidden_seconds * 1e3},
            "loss_scale": self.scaler.scale_value if self._mixed else 1.0,
            "mixed_precision": self._mixed,
            "gradient_accumulation_steps": self.config.gradient_accumulation_steps,
            "world_size": self._world,
            "communication": self.profiler.get_statistics(),
        }

    def __repr__(self) -> str:
        return (f"AdvancedDistributedDataParallel(world_size={self._world}, "
                f"accumulation={self.config.gradient_accumulation_steps}, "
                f"mixed_precision={self._mixed})\n  module: {self.module!r}")
