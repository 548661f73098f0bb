"""The optimizer ``AdvancedDistributedDataParallel.wrap_optimizer`` hands back for a ZeRO stage.

At stage 1 the optimizer state is sharded over the ranks, so the user's optimizer (a class, or
an instance that has not stepped yet) is rebuilt as a ZeRO optimizer with its class, parameter
groups and defaults. At the other stages an optimizer over the wrapper's ``parameters()``
(FSDP's shards at stages 2 and 3) is the right one: an instance already over them is kept, a
class is built on them, and an instance over anything else is refused with what to pass.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Sequence

from ...optim import Optimizer

# (optimizer class, parameters or parameter groups, defaults) -> the stage-1 optimizer
ZeroBuilder = Callable[[type, Any, Dict[str, Any]], Optimizer]


def optimizer_for_stage(optimizer: Any, defaults: Dict[str, Any], stage: int,
                        own_params: Sequence, build_zero: ZeroBuilder) -> Optimizer:
    """The optimizer to train with at ZeRO ``stage`` (see the module docstring).
    ``own_params`` are the wrapper's ``parameters()``; ``build_zero`` builds the stage-1
    optimizer."""
    if isinstance(optimizer, Optimizer):
        if defaults:
            raise TypeError(f"wrap_optimizer: pass options only with an optimizer class, "
                            f"got an optimizer instance and {sorted(defaults)}")
        ours = {id(p) for p in own_params}
        theirs = [p for g in optimizer.param_groups for p in g["params"]]
        if stage != 1 and all(id(p) in ours for p in theirs):
            return optimizer
        if stage != 1:
            raise ValueError(f"wrap_optimizer: at zero_stage={stage} the optimizer must hold "
                             f"this wrapper's parameters() (the shards), not the model's; "
                             f"pass the optimizer class instead")
        if len(optimizer.state):
            raise ValueError(f"wrap_optimizer: the {type(optimizer).__name__} already holds "
                             f"state for {len(optimizer.state)} parameters; wrap it before "
                             f"its first step")
        return build_zero(type(optimizer), optimizer.param_groups, dict(optimizer.defaults))
    if isinstance(optimizer, type) and issubclass(optimizer, Optimizer):
        if stage != 1:
            return optimizer(list(own_params), **defaults)
        return build_zero(optimizer, list(own_params), defaults)
    raise TypeError(f"wrap_optimizer needs an Optimizer class or instance, got {optimizer!r}")
