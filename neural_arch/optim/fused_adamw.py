"""``FusedAdamW``: an ``AdamW`` whose GPU parameters are updated by one kernel launch.

The multi-tensor kernel itself is array-level (``adamw_step`` in
``neural_arch.backends.cupy_kernels``); the optimizer around it lives here, next to ``AdamW``,
so the backends never import an optimizer.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..backends import backend_for
from ..backends.kernels.dispatch import kernels_for
from .adam import AdamW
from .optimizer import parameters_with_grad

_FLOAT32 = np.dtype(np.float32)  # compared, not named: dtype.name costs microseconds


def optimizer_kernels(array: Any) -> Any:
    """The kernels ``FusedAdamW`` uses for a parameter array, or None to use AdamW's rule."""
    return kernels_for(array) if backend_for(array).name == "cupy" else None


class FusedAdamW(AdamW):
    """``AdamW`` whose float32, C-contiguous GPU parameters are updated by one kernel launch per
    parameter group (and step count). Other parameters (CPU, float64, AMSGrad groups) take
    ``AdamW``'s own step; state and ``state_dict`` are ``AdamW``'s."""

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._evaluate_closure(closure)
        leftover_groups = []
        for group in self.param_groups:
            batches: Dict[Tuple[int, int], List[Any]] = {}
            leftover = []
            for param, _ in parameters_with_grad(group):
                kernels = None if group["amsgrad"] else optimizer_kernels(param.array)
                if kernels is None or not _fusable(param):
                    leftover.append(param)
                    continue
                state = self.state[param]
                if not state:
                    xp = backend_for(param.array).xp
                    state.update(step=0, exp_avg=xp.zeros_like(param.array),
                                 exp_avg_sq=xp.zeros_like(param.array))
                state["step"] += 1
                batches.setdefault((id(kernels), state["step"]), [kernels]).append(param)
            for (_, step), (kernels, *params) in batches.items():
                self._fused_update(kernels, params, group, step)
            leftover_groups.append(dict(group, params=leftover))
        if any(g["params"] for g in leftover_groups):
            groups, self.param_groups = self.param_groups, leftover_groups
            try:
                super().step()
            finally:
                self.param_groups = groups
        return loss

    def _fused_update(self, kernels: Any, params: List[Any], group: dict, step: int) -> None:
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in params]
        for param in params:
            param.mark_modified_in_place()  # the kernel writes `.array` in place
        kernels.adamw_step([p.array for p in params], [p.grad.array for p in params],
                           [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                           step=step, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                           weight_decay=group["weight_decay"], maximize=group["maximize"])


def _fusable(param: Any) -> bool:
    data, grad = param.array, param.grad.array
    return (data.dtype == _FLOAT32 and grad.dtype == _FLOAT32
            and data.flags.c_contiguous and grad.shape == data.shape)


__all__ = ["FusedAdamW", "optimizer_kernels"]
