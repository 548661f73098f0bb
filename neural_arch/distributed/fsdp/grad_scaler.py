"""``ShardedGradScaler``: loss scaling for float16 training when each rank holds only some of
the gradients (torch's ``ShardedGradScaler``).

An overflow shows up only in the shard that holds it, so the ranks must agree before
stepping: the inf/NaN check of the shards' gradients is combined over the group (MAX of a
flag), and every rank then skips the step, or none does, and adapts the scale the same way.
The scaling rule is ``LossScaler``'s (PyTorch GradScaler's).

    scaler = ShardedGradScaler(init_scale=1024)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)          # optional: before clipping
    fsdp.clip_grad_norm_(1.0)
    scaler.step(optimizer)              # skipped on every rank after an overflow
    scaler.update()
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

import numpy as np

from .. import collectives
from ..ddp.loss_scaler import LossScaler
from ..reduce_ops import ReduceOp


def _grads(optimizer: Any) -> List[Any]:
    return [p.grad.array for group in optimizer.param_groups for p in group["params"]
            if p.grad is not None]


class ShardedGradScaler:
    """``LossScaler``'s arguments, plus the ``process_group`` the ranks agree over."""

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 1000,
                 min_scale: float = 1.0, dynamic: bool = True,
                 process_group: Any = None) -> None:
        self._scaler = LossScaler(init_scale, growth_factor, backoff_factor, growth_interval,
                                  min_scale, dynamic)
        self.process_group = process_group
        self._found_inf: Optional[bool] = None  # this step's verdict, once unscaled

    def scale(self, loss: Any) -> Any:
        return self._scaler.scale(loss)

    def get_scale(self) -> float:
        return self._scaler.get_scale()

    def unscale_(self, optimizer: Any) -> bool:
        """Divide the optimizer's gradients by the scale (once per step) and decide, with the
        other ranks, whether any of them overflowed; returns that verdict."""
        if self._found_inf is None:
            grads = _grads(optimizer)
            flag = np.array([1 if LossScaler.found_inf(grads) else 0], dtype=np.int32)
            collectives.all_reduce(flag, ReduceOp.MAX, group=self.process_group)
            self._found_inf = bool(flag[0])
            with np.errstate(over="ignore", invalid="ignore"):
                self._scaler.unscale_(grads)
        return self._found_inf

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step()`` unless some rank's gradients overflowed (then None)."""
        if self.unscale_(optimizer):
            return None
        return optimizer.step(*args, **kwargs)

    def update(self) -> None:
        """Adapt the scale to this step's verdict (every rank the same)."""
        if self._found_inf is None:
            raise RuntimeError("ShardedGradScaler.update() before step() or unscale_() of "
                               "this iteration")
        self._scaler.update(self._found_inf)
        self._found_inf = None

    def state_dict(self) -> Dict[str, Any]:
        return self._scaler.state_dict()

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self._scaler.load_state_dict(state_dict)

    def __repr__(self) -> str:
        return f"Sharded{self._scaler!r}"
