"""Stochastic gradient descent with PyTorch's momentum, dampening and Nesterov rules."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Optional

from .optimizer import Optimizer, parameters_with_grad


class SGD(Optimizer):
    """``p -= lr * g`` with optional L2 decay, momentum (buffer starts as the first gradient),
    dampening and Nesterov momentum, exactly as ``torch.optim.SGD``."""

    def __init__(self, params: Iterable[Any], lr: float = 1e-3, momentum: float = 0.0,
                 dampening: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False,
                 maximize: bool = False) -> None:
        if lr < 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if momentum < 0.0:
            raise ValueError(f"Invalid momentum value: {momentum}")
        if weight_decay < 0.0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                f"Nesterov momentum requires a momentum and zero dampening, got "
                f"momentum={momentum} dampening={dampening}")
        defaults = dict(lr=lr, momentum=momentum, dampening=dampening,
                        weight_decay=weight_decay, nesterov=nesterov, maximize=maximize)
        super().__init__(params, defaults)

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Update every parameter that has a gradient; returns the closure's loss if given."""
        loss = self._evaluate_closure(closure)
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            dampening, weight_decay = group["dampening"], group["weight_decay"]
            nesterov, maximize = group["nesterov"], group["maximize"]
            plain = momentum == 0 and weight_decay == 0 and not maximize
            for param, grad in parameters_with_grad(group):
                param.mark_modified_in_place()  # the update below writes `.array` in place
                data = param.array
                if plain:
                    data -= lr * grad
                    continue
                if maximize:
                    grad = -grad
                if weight_decay != 0:
                    grad = grad + weight_decay * data
                if momentum != 0:
                    state = self.state[param]
                    buf = state.get("momentum_buffer")
                    if buf is None:
                        buf = grad.copy()
                        state["momentum_buffer"] = buf
                    else:
                        buf *= momentum
                        buf += (1 - dampening) * grad
                    grad = grad + momentum * buf if nesterov else buf
                data -= lr * grad
        return loss
