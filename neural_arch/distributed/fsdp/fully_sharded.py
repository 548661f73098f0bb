"""``FullyShardedDataParallel``: data parallelism where each rank keeps only 1/N of the
parameters, gradients and optimizer state (ZeRO-3; ZeRO-2 and DDP-like as options).

The model is split into units (``wrap.py``): the wrapped module is the root unit, and with an
``auto_wrap_policy`` each chosen submodule (a transformer ``Block``, say) is one more. A unit's
parameters are one flat vector, padded to a multiple of the world size N; rank r keeps slice r
as a ``Parameter`` (``flat_param.py``, ``unit.py``). ``parameters()`` yields only these
shards: build the optimizer on them and it keeps state for 1/N of the model. Around forward
and backward each unit's full parameters are all-gathered when needed and freed after, and
gradients are reduce-scattered into the shards (``schedule.py``). Training equals one process
on the concatenated batch: the gradients are averaged over the ranks.

The wrapped module keeps its structure, its parameters (same objects) and its state-dict
keys; only its parameters' values are not there outside forward and backward. Use
``full_state_dict()`` / ``load_full_state_dict()`` or ``summon_full_params()`` to see or set
them (``state.py``). For sharded checkpoints, ``flat_shards()`` lists each unit's shard with
its layout and ``load_flat(unit, full_flat)`` sets a shard from a full flat vector.

Parameters must be NumPy arrays (CPU). The wrapper replaces the ``forward`` of each non-root
unit's module with one that gathers before and frees after.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, List, Tuple

import numpy as np

from ...core import Tensor
from ...nn import Module, Parameter
from ...nn.module_state import state_dict_copy
from ..group.world import get_world_size, is_initialized
from ..replicas import broadcast_module_state, check_replicas_agree
from . import state
from .flat_param import GatherStats
from .options import MixedPrecision, ShardingStrategy
from .schedule import Schedule
from .unit import Unit
from .wrap import assign_parameters, unit_prefixes


def _check_numpy(module: Module) -> None:
    for name, param in module.named_parameters():
        if not isinstance(param.array, np.ndarray):
            raise TypeError(f"FullyShardedDataParallel supports NumPy (CPU) parameters only; "
                            f"{name!r} is a {type(param.array).__module__}."
                            f"{type(param.array).__name__} on {param.device}")


def _cast_floating(value: Any, dtype: np.dtype) -> Any:
    """``value`` with its floating tensors and arrays (nested in lists, tuples, dicts) cast
    to ``dtype``; tensors stay in the graph."""
    if isinstance(value, Tensor):
        return value.astype(dtype) if value.dtype.kind == "f" and value.dtype != dtype else value
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        return value.astype(dtype)
    if isinstance(value, (list, tuple)):
        return type(value)(_cast_floating(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floating(v, dtype) for k, v in value.items()}
    return value


class FullyShardedDataParallel(Module):
    """Sharded data parallelism; see the module docstring.

    ``sharding_strategy``: ``ShardingStrategy`` or its name ("FULL_SHARD", "SHARD_GRAD_OP",
    "NO_SHARD"). ``auto_wrap_policy``: a torch-style policy, or a set of module classes.
    ``mixed_precision``: False, True (float16 compute and reduction, float32 shards) or a
    ``MixedPrecision``. ``prefetch``: gather the next unit in the background (forward and
    backward), from the second iteration on. ``sync_module_states``: start every rank from
    rank 0's parameters and buffers. ``ShardingStrategy.for_zero_stage(n)`` maps DeepSpeed's
    ``zero_stage`` onto a strategy.
    """

    def __init__(self, module: Module, process_group: Any = None,
                 sharding_strategy: Any = ShardingStrategy.FULL_SHARD,
                 auto_wrap_policy: Any = None, mixed_precision: Any = False,
                 prefetch: bool = True, sync_module_states: bool = True,
                 device_id: Any = None) -> None:
        super().__init__()
        if device_id is not None:  # torch's argument; a CPU module takes None, as in torch
            raise ValueError(f"FullyShardedDataParallel(device_id={device_id!r}): parameters "
                             "are NumPy arrays on the CPU, leave device_id None")
        self.sharding_strategy = ShardingStrategy.parse(sharding_strategy)
        self.mixed_precision = MixedPrecision.parse(mixed_precision)
        if not is_initialized():
            raise RuntimeError("FullyShardedDataParallel needs an initialized process group: "
                               "call init_process_group() first")
        _check_numpy(module)
        self.module = module
        self.process_group = process_group
        self.world_size = get_world_size(process_group)
        check_replicas_agree(module, process_group, "FullyShardedDataParallel")
        if sync_module_states:  # every rank starts from rank 0's parameters and buffers
            broadcast_module_state(module, process_group)
        self._stats = GatherStats()
        prefixes = unit_prefixes(module, auto_wrap_policy)
        owned = assign_parameters(module, prefixes)
        modules = dict(module.named_modules())
        units = [Unit(p, modules[p], owned[p], process_group, self.sharding_strategy,
                      self.mixed_precision, self._stats) for p in prefixes if owned[p]]
        root = units[0] if units and units[0].name == "" else None
        others = units[1:] if root is not None else units
        self._units: List[Unit] = units
        self._schedule = Schedule(root, others, self.sharding_strategy, self._stats, prefetch)
        for unit in others:
            self._wrap_forward(unit)
        for unit in units:
            for param in unit.params:
                param.register_post_accumulate_grad_hook(self._schedule.grad_ready)

    # -- construction ----------------------------------------------------------------------
    def _wrap_forward(self, unit: Unit) -> None:
        original, schedule = unit.module.forward, self._schedule

        def forward(*args: Any, **kwargs: Any) -> Any:
            schedule.unit_pre_forward(unit)
            output = original(*args, **kwargs)
            schedule.unit_post_forward(unit, output)
            return output
        unit.module.forward = forward

    # -- training --------------------------------------------------------------------------
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        mixed = self.mixed_precision if self._units else None
        if mixed is not None and mixed.cast_forward_inputs:
            dtype = self._units[0].compute_dtype
            args, kwargs = _cast_floating(args, dtype), _cast_floating(kwargs, dtype)
        self._schedule.root_pre_forward()
        try:
            output = self.module(*args, **kwargs)
        except BaseException:
            self._schedule.forward_failed()
            raise
        self._schedule.root_post_forward(output)
        if mixed is not None and mixed.cast_forward_outputs:
            output = _cast_floating(output, self._units[0].master_dtype)
        return output

    def named_parameters(self, prefix: str = "", recurse: bool = True
                         ) -> Iterator[Tuple[str, Parameter]]:
        """The shards (what an optimizer steps), one per unit: ``"flat_param"`` for the root,
        ``"<module path>.flat_param"`` for the others."""
        for unit in self._units:
            name = unit.shard.name
            yield (f"{prefix}.{name}" if prefix else name), unit.shard

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Clear the shards' gradients and any full gradients ``no_sync()`` accumulated."""
        super().zero_grad(set_to_none)
        for unit in self._units:
            for param in unit.params:
                param.grad = None

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backwards inside accumulate full gradients on the parameters without communicating
        (FULL_SHARD keeps them unsharded, as torch does); the first backward after it averages
        the sums into the shards."""
        previous, self._schedule.sync_enabled = self._schedule.sync_enabled, False
        try:
            yield
        finally:
            self._schedule.sync_enabled = previous

    def clip_grad_norm_(self, max_norm: float, norm_type: float = 2.0) -> np.float64:
        """Clip the shards' gradients by the norm of the whole model's gradient (combined over
        the ranks); returns that norm, as ``optim.clip_grad_norm_`` would on one process."""
        return state.clip_grad_norm_(self._units, self.process_group,
                                     self.sharding_strategy.shards_parameters, max_norm,
                                     norm_type)

    # -- full and sharded views ------------------------------------------------------------
    def summon_full_params(self, writeback: bool = True):
        """Context manager: inside, the module's parameters hold their full values (in their
        own dtype); with ``writeback`` changes to them are copied into the shards on exit.
        Collective: every rank must enter it. Not during forward or backward."""
        if self._schedule.busy:
            raise RuntimeError("FullyShardedDataParallel.summon_full_params() during the "
                               "wrapper's forward or backward; call it between steps")
        return state.summon_full_params(self._units, self._stats, writeback)

    def full_state_dict(self) -> Dict[str, np.ndarray]:
        """The wrapped module's ``state_dict()`` with full values, on every rank (collective)."""
        with self.summon_full_params(writeback=False):
            return dict(state_dict_copy(self.module))  # the full values go on exit

    def load_full_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> Any:
        """Load a full state dict (the wrapped module's keys) into the shards (collective)."""
        with self.summon_full_params(writeback=True):
            return self.module.load_state_dict(state_dict, strict=strict)

    state_dict = full_state_dict
    load_state_dict = load_full_state_dict

    def flat_shards(self) -> List[state.FlatShard]:
        """Each unit's shard and layout, in a fixed order (root first, then units in module
        order); see ``state.FlatShard``. The unpadded layout does not depend on the world size,
        so shards written by N ranks can be reassembled and loaded by M ranks."""
        return state.flat_shards(self._units)

    def load_flat(self, unit: str, full_flat: Any) -> None:
        """Set unit ``unit``'s shard (named as in ``flat_shards()``) from its full flat vector."""
        for candidate in self._units:
            if candidate.name == unit:
                return state.load_flat(candidate, full_flat)
        raise KeyError(f"FullyShardedDataParallel.load_flat: no unit {unit!r}; units are "
                       f"{[u.name for u in self._units]}")

    def shards_changed(self) -> None:
        """Call after writing into the shards other than by an optimizer step after backward
        (a checkpoint load, say): the next forward gathers them again."""
        self._stats.generation += 1

    def memory_stats(self) -> Dict[str, int]:
        """Bytes of full parameters gathered now and at peak (they live in memory maps, which
        tracemalloc does not see), the bytes all units take when gathered, and this rank's
        shard bytes."""
        return {"gathered_bytes": self._stats.gathered_bytes,
                "peak_gathered_bytes": self._stats.peak_gathered_bytes,
                "full_bytes": sum(u.buffer.nbytes for u in self._units),
                "shard_bytes": sum(u.shard.array.nbytes for u in self._units)}

    def reset_peak_memory_stats(self) -> None:
        self._stats.peak_gathered_bytes = self._stats.gathered_bytes

    def __repr__(self) -> str:
        units = ", ".join(repr(u.name or "<root>") for u in self._units)
        return (f"FullyShardedDataParallel(world_size={self.world_size}, "
                f"sharding_strategy={self.sharding_strategy.name}, units=[{units}])\n"
                f"  module: {self.module!r}")
