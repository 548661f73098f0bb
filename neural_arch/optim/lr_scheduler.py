"""Learning-rate schedulers with PyTorch's interface (``step``, ``get_last_lr``, state dicts).

Each scheduler computes its learning rate in closed form from the group's ``initial_lr`` and
``last_epoch``; the values equal PyTorch's (whose chainable recursions compute the same
quantities). Compose schedulers with ``SequentialLR`` rather than stepping two at once.
"""
from __future__ import annotations

import copy
import math
import types
from bisect import bisect_right
from typing import Any, Callable, Dict, List, Sequence, Union

from .optimizer import Optimizer


class LRScheduler:
    """Base class: subclasses define ``_lr_at(base_lr, epoch)``."""

    def __init__(self, optimizer: Optimizer, last_epoch: int = -1) -> None:
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"{type(optimizer).__name__} is not an Optimizer")
        self.optimizer = optimizer
        if last_epoch == -1:
            for group in optimizer.param_groups:
                group.setdefault("initial_lr", group["lr"])
        else:
            for i, group in enumerate(optimizer.param_groups):
                if "initial_lr" not in group:
                    raise KeyError(
                        f"param 'initial_lr' is not specified in param_groups[{i}] when resuming "
                        f"with last_epoch={last_epoch}")
        self.base_lrs: List[float] = [group["initial_lr"] for group in optimizer.param_groups]
        self.last_epoch = last_epoch
        self._initial_step()

    def _initial_step(self) -> None:
        self.step()

    def _lr_at(self, base_lr: float, epoch: int) -> float:
        return base_lr

    def get_lr(self) -> List[float]:
        """Learning rates for the current ``last_epoch``."""
        return [self._lr_at(base_lr, self.last_epoch) for base_lr in self.base_lrs]

    def step(self, epoch: Union[int, None] = None) -> None:
        """Advance one epoch (or jump to ``epoch``) and write the new rates into the optimizer."""
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        for group, lr in zip(self.optimizer.param_groups, self.get_lr()):
            group["lr"] = lr
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]

    def get_last_lr(self) -> List[float]:
        """The rates set by the latest ``step``."""
        return list(self._last_lr)

    def state_dict(self) -> Dict[str, Any]:
        """Every attribute except the optimizer (copied, so later steps do not alter it)."""
        return {key: copy.deepcopy(value) for key, value in self.__dict__.items()
                if key != "optimizer"}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        self.__dict__.update(copy.deepcopy(state_dict))


class LambdaLR(LRScheduler):
    """``lr = initial_lr * lr_lambda(epoch)``; one function, or one per parameter group."""

    def __init__(self, optimizer: Optimizer,
                 lr_lambda: Union[Callable[[int], float], Sequence[Callable[[int], float]]],
                 last_epoch: int = -1) -> None:
        groups = len(optimizer.param_groups)
        if isinstance(lr_lambda, (list, tuple)):
            if len(lr_lambda) != groups:
                raise ValueError(f"expected {groups} lr_lambdas, got {len(lr_lambda)}")
            self.lr_lambdas = list(lr_lambda)
        else:
            self.lr_lambdas = [lr_lambda] * groups
        super().__init__(optimizer, last_epoch)

    def get_lr(self) -> List[float]:
        return [base * fn(self.last_epoch) for base, fn in zip(self.base_lrs, self.lr_lambdas)]

    def state_dict(self) -> Dict[str, Any]:
        # Functions are not data; only callable objects carry state worth saving (as PyTorch).
        state = {k: copy.deepcopy(v) for k, v in self.__dict__.items()
                 if k not in ("optimizer", "lr_lambdas")}
        state["lr_lambdas"] = [None if isinstance(fn, types.FunctionType) else dict(fn.__dict__)
                               for fn in self.lr_lambdas]
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        state = dict(state_dict)
        saved_lambdas = state.pop("lr_lambdas", [None] * len(self.lr_lambdas))
        self.__dict__.update(state)
        for fn, saved in zip(self.lr_lambdas, saved_lambdas):
            if saved is not None:
                fn.__dict__.update(saved)


class StepLR(LRScheduler):
    """``lr = initial_lr * gamma ** (epoch // step_size)``."""

    def __init__(self, optimizer: Optimizer, step_size: int, gamma: float = 0.1,
                 last_epoch: int = -1) -> None:
        if step_size < 1:
            raise ValueError(f"step_size must be a positive integer, got {step_size}")
        self.step_size, self.gamma = int(step_size), gamma
        super().__init__(optimizer, last_epoch)

    def _lr_at(self, base_lr: float, epoch: int) -> float:
        return base_lr * self.gamma ** (epoch // self.step_size)


class LinearLR(LRScheduler):
    """Multiply the rate by a factor moving linearly from ``start_factor`` to ``end_factor``
    over ``total_iters`` epochs (a warm-up when ``start_factor < 1``)."""

    def __init__(self, optimizer: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5, last_epoch: int = -1) -> None:
        if not 0 < start_factor <= 1:
            raise ValueError(f"start_factor must be in (0, 1], got {start_factor}")
        if not 0 <= end_factor <= 1:
            raise ValueError(f"end_factor must be in [0, 1], got {end_factor}")
        if total_iters < 0:
            raise ValueError(f"total_iters must be non-negative, got {total_iters}")
        self.start_factor, self.end_factor, self.total_iters = start_factor, end_factor, total_iters
        super().__init__(optimizer, last_epoch)

    def _lr_at(self, base_lr: float, epoch: int) -> float:
        if self.total_iters == 0:
            return base_lr * self.end_factor
        progress = min(self.total_iters, epoch) / self.total_iters
        return base_lr * (self.start_factor + (self.end_factor - self.start_factor) * progress)


class CosineAnnealingLR(LRScheduler):
    """``lr = eta_min + (initial_lr - eta_min) * (1 + cos(pi * epoch / T_max)) / 2``."""

    def __init__(self, optimizer: Optimizer, T_max: int, eta_min: float = 0.0,
                 last_epoch: int = -1) -> None:
        if T_max <= 0:
            raise ValueError(f"T_max must be positive, got {T_max}")
        self.T_max, self.eta_min = T_max, eta_min
        super().__init__(optimizer, last_epoch)

    def _lr_at(self, base_lr: float, epoch: int) -> float:
        cosine = math.cos(math.pi * epoch / self.T_max)
        return self.eta_min + (base_lr - self.eta_min) * (1 + cosine) / 2


class SequentialLR(LRScheduler):
    """Run ``schedulers[i]`` between ``milestones[i-1]`` and ``milestones[i]``; each one starts
    from its epoch 0 when its milestone is reached."""

    def __init__(self, optimizer: Optimizer, schedulers: Sequence[LRScheduler],
                 milestones: Sequence[int], last_epoch: int = -1) -> None:
        if len(schedulers) < 1:
            raise ValueError("SequentialLR expects at least one scheduler, got none")
        for index, scheduler in enumerate(schedulers):
            if getattr(scheduler, "optimizer", None) is not optimizer:
                raise ValueError(
                    f"SequentialLR expects all schedulers to belong to the same optimizer, "
                    f"scheduler {index} ({type(scheduler).__name__}) does not")
        if len(milestones) != len(schedulers) - 1:
            raise ValueError(
                f"SequentialLR expects one milestone fewer than schedulers, got "
                f"{len(schedulers)} schedulers and {len(milestones)} milestones")
        self.optimizer = optimizer
        self._schedulers = list(schedulers)
        self._milestones = list(milestones)
        self.last_epoch = last_epoch + 1
        for group in optimizer.param_groups:
            group["lr"] = group["initial_lr"]
        # Constructing each scheduler stepped it once; rewind them so each starts fresh.
        self._undo_initial_steps(self)
        index = bisect_right(self._milestones, 0)
        self._schedulers[index]._initial_step()
        self._last_lr = self._schedulers[index].get_last_lr()

    @classmethod
    def _undo_initial_steps(cls, scheduler: Any) -> None:
        nested = getattr(scheduler, "_schedulers", None)
        if nested is not None:
            for inner in nested:
                cls._undo_initial_steps(inner)
        else:
            scheduler.last_epoch -= 1

    def step(self, epoch: Union[int, None] = None) -> None:
        if epoch is not None:
            raise TypeError("SequentialLR.step() takes no epoch argument")
        self.last_epoch += 1
        index = bisect_right(self._milestones, self.last_epoch)
        scheduler = self._schedulers[index]
        if index > 0 and self._milestones[index - 1] == self.last_epoch:
            scheduler.step(0)
        else:
            scheduler.step()
        self._last_lr = scheduler.get_last_lr()

    def state_dict(self) -> Dict[str, Any]:
        state = {k: copy.deepcopy(v) for k, v in self.__dict__.items()
                 if k not in ("optimizer", "_schedulers")}
        state["_schedulers"] = [scheduler.state_dict() for scheduler in self._schedulers]
        return state

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        state = dict(state_dict)
        nested = state.pop("_schedulers")
        self.__dict__.update(state)
        for scheduler, saved in zip(self._schedulers, nested):
            scheduler.load_state_dict(saved)
