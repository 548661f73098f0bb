"""Adam and AdamW with PyTorch's bias correction and decoupled weight decay."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Optional, Tuple

from ..backends import xp_of
from .optimizer import Optimizer, parameters_with_grad


class Adam(Optimizer):
    """``torch.optim.Adam``: L2 decay added to the gradient, ``denom = sqrt(v)/sqrt(bc2) + eps``,
    ``step_size = lr / bc1``, optional AMSGrad."""

    _decoupled_decay = False

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.0, amsgrad: bool = False, maximize: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"Invalid beta parameters: {tuple(betas)}, each must be in [0, 1)")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        defaults = dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                        amsgrad=amsgrad, maximize=maximize)
        super().__init__(params, defaults)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Update every parameter that has a gradient; returns the closure's loss if given."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            lr, (beta1, beta2), eps = group["lr"], group["betas"], group["eps"]
            weight_decay, amsgrad = group["weight_decay"], group["amsgrad"]
            maximize = group["maximize"]
            for param, grad in parameters_with_grad(group):
                param.mark_modified_in_place()  # every path below writes `.array` in place
                data = param.array
                if maximize:
                    grad = -grad
                state = self.state[param]
                xp = xp_of(data)
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = xp.zeros_like(data)
                    state["exp_avg_sq"] = xp.zeros_like(data)
                    if amsgrad:
                        state["max_exp_avg_sq"] = xp.zeros_like(data)
                state["step"] += 1
                step = state["step"]
                if not (amsgrad or maximize) and self._compiled_update(
                        data, grad, state, step, lr, beta1, beta2, eps, weight_decay):
                    continue
                if weight_decay != 0:
                    if self._decoupled_decay:
                        data *= 1 - lr * weight_decay
                    else:
                        grad = grad + weight_decay * data
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                exp_avg += (grad - exp_avg) * (1 - beta1)
                exp_avg_sq *= beta2
                exp_avg_sq += (1 - beta2) * (grad * grad)
                bias_correction1 = 1 - beta1 ** step
                bias_correction2_sqrt = math.sqrt(1 - beta2 ** step)
                second_moment = exp_avg_sq
                if amsgrad:
                    xp.maximum(state["max_exp_avg_sq"], exp_avg_sq, out=state["max_exp_avg_sq"])
                    second_moment = state["max_exp_avg_sq"]
                denom = xp.sqrt(second_moment) / bias_correction2_sqrt + eps
                data -= (lr / bias_correction1) * (exp_avg / denom)
        return loss


    def _compiled_update(self, data: Any, grad: Any, state: dict, step: int, lr: float,
                         beta1: float, beta2: float, eps: float, weight_decay: float) -> bool:
        """The same update as the NumPy form below, by one compiled pass over a CPU float
        parameter (``backends.adam_kernels``); False where that kernel does not apply."""
        # imported on first step, not with the optimizer: importing it imports Numba
        from ..backends import adam_kernels
        decoupled = self._decoupled_decay
        return adam_kernels.update(
            data, grad, state["exp_avg"], state["exp_avg_sq"],
            decay=1 - lr * weight_decay if decoupled else 1.0,
            l2=0.0 if decoupled else weight_decay, beta1=beta1, beta2=beta2,
            bias_correction2_sqrt=math.sqrt(1 - beta2 ** step), eps=eps,
            step_size=lr / (1 - beta1 ** step))


class AdamW(Adam):
    """``torch.optim.AdamW``: Adam with decoupled decay ``p *= 1 - lr * weight_decay`` first."""

    _decoupled_decay = True

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: Tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, amsgrad: bool = False, maximize: bool = False) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         amsgrad=amsgrad, maximize=maximize)
