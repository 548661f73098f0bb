"""``LossScaler``: dynamic loss scaling for float16 training, with PyTorch GradScaler's rule.

Small float16 gradients underflow to zero. Multiplying the loss by a large scale before
backward lifts them into float16's range; the gradients are divided by the same scale
(``unscale_``) before the optimizer sees them. When a step produces inf/NaN the step is skipped
and the scale shrinks by ``backoff_factor``; after ``growth_interval`` clean steps in a row it
grows by ``growth_factor``.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterable, List

import numpy as np

from ...amp.grad_scaler import next_scale
from ...backends import xp_of


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"LossScaler {name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not (math.isfinite(value) and value > 0.0):
        raise ValueError(f"LossScaler {name} must be a finite number > 0, got {value}")
    return value


def _arrays(grads: Iterable[Any]) -> List[Any]:
    """Gradient arrays of ``grads``: arrays as they are, tensors/parameters by their ``.grad``."""
    if hasattr(grads, "shape") or hasattr(grads, "grad"):
        grads = [grads]
    out = []
    for g in grads:
        if hasattr(g, "grad") and hasattr(g, "requires_grad"):
            g = None if g.grad is None else g.grad.array
        if g is not None:
            out.append(g)
    return out


class LossScaler:
    """Scale the loss up, the gradients down, and adapt the scale to overflows.

    ``update(found_inf)`` follows ``torch.amp.GradScaler``: on inf/NaN the scale is multiplied
    by ``backoff_factor`` (but never below ``min_scale``) and the clean-step count restarts;
    otherwise the count grows and, on reaching ``growth_interval``, the scale is multiplied by
    ``growth_factor`` (only if the result stays a finite float32) and the count restarts.
    With ``dynamic=False`` the scale never changes.
    """

    def __init__(self, init_scale: float = 65536.0, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 1000,
                 min_scale: float = 1.0, dynamic: bool = True) -> None:
        self._scale = _positive("init_scale", init_scale)
        self.growth_factor = _positive("growth_factor", growth_factor)
        self.backoff_factor = _positive("backoff_factor", backoff_factor)
        self.min_scale = _positive("min_scale", min_scale)
        if self.growth_factor <= 1.0:
            raise ValueError(f"LossScaler growth_factor must be > 1, got {growth_factor}")
        if self.backoff_factor >= 1.0:
            raise ValueError(f"LossScaler backoff_factor must be < 1, got {backoff_factor}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval, (int, np.integer)):
            raise TypeError(f"LossScaler growth_interval must be an int, got "
                            f"{type(growth_interval).__name__}")
        if growth_interval < 1:
            raise ValueError(f"LossScaler growth_interval must be >= 1, got {growth_interval}")
        if self.min_scale > self._scale:
            raise ValueError(f"LossScaler min_scale ({min_scale}) must not exceed init_scale "
                             f"({init_scale})")
        self.growth_interval = int(growth_interval)
        self.dynamic = bool(dynamic)
        self._growth_tracker = 0  # clean steps since the last change of scale

    # ------------------------------------------------------------------ scale
    @property
    def scale_value(self) -> float:
        return self._scale

    def get_scale(self) -> float:
        return self._scale

    def scale(self, loss: Any) -> Any:
        """``loss * scale`` (a Tensor stays in the graph, so backward sees the scaled loss)."""
        return loss * self._scale

    def unscale_(self, grads: Iterable[Any]) -> None:
        """Divide gradients by the scale in place (arrays, or tensors by their ``.grad``)."""
        inv = 1.0 / self._scale  # a Python float: applied in each gradient's own precision
        for g in _arrays(grads):
            g *= inv

    @staticmethod
    def found_inf(grads: Iterable[Any]) -> bool:
        """True when any gradient holds an inf or NaN."""
        for g in _arrays(grads):
            if not bool(xp_of(g).isfinite(g).all()):
                return True
        return False

    # ------------------------------------------------------------------ update
    def update(self, found_inf: bool) -> None:
        """Adapt the scale after a step that did (``found_inf``) or did not overflow."""
        if not self.dynamic:
            return
        # torch's rule (GradScaler's), then this scaler's floor
        scale, self._growth_tracker = next_scale(self._scale, self._growth_tracker, found_inf,
                                                 self.growth_factor, self.backoff_factor,
                                                 self.growth_interval)
        self._scale = max(scale, self.min_scale)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        return {"scale": self._scale, "growth_factor": self.growth_factor,
                "backoff_factor": self.backoff_factor, "growth_interval": self.growth_interval,
                "min_scale": self.min_scale, "dynamic": self.dynamic,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore what ``state_dict`` saved (every key is required)."""
        missing = sorted(set(self.state_dict()) - set(state_dict))
        if missing:
            raise KeyError(f"LossScaler state dict lacks keys {missing}")
        restored = LossScaler(state_dict["scale"], state_dict["growth_factor"],
                              state_dict["backoff_factor"], state_dict["growth_interval"],
                              state_dict["min_scale"], state_dict["dynamic"])
        tracker = int(state_dict["_growth_tracker"])
        if not 0 <= tracker < restored.growth_interval:
            raise ValueError(f"LossScaler _growth_tracker must be in [0, "
                             f"{restored.growth_interval}), got {tracker}")
        restored._growth_tracker = tracker
        self.__dict__.update(restored.__dict__)

    def __repr__(self) -> str:
        return (f"LossScaler(scale={self._scale}, growth_factor={self.growth_factor}, "
                f"backoff_factor={self.backoff_factor}, growth_interval={self.growth_interval}, "
                f"min_scale={self.min_scale}, dynamic={self.dynamic})")
