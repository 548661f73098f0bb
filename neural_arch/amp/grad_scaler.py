"""``GradScaler``: torch's dynamic loss scaling around an optimizer's step.

float16 gradients of small values underflow to zero; scaling the loss by ``scale`` before
backward lifts them. ``step`` divides the gradients by the scale (``unscale_``) and skips the
optimizer's step when any gradient holds an inf or NaN; ``update`` then shrinks the scale by
``backoff_factor``, or grows it by ``growth_factor`` after ``growth_interval`` clean steps.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ..backends import device_type, get_backend, xp_of

_FLOAT32_MAX = float(np.finfo(np.float32).max)  # torch keeps the scale in a float32 tensor
_READY, _UNSCALED, _STEPPED = "ready", "unscaled", "stepped"


def next_scale(scale: float, growth_tracker: int, found_inf: bool, growth_factor: float,
               backoff_factor: float, growth_interval: int) -> Tuple[float, int]:
    """(scale, clean steps in a row) after one step, by torch's ``_amp_update_scale_``."""
    if found_inf:
        return scale * backoff_factor, 0
    growth_tracker += 1
    if growth_tracker == growth_interval:
        grown = scale * growth_factor
        return (grown if grown <= _FLOAT32_MAX else scale), 0
    return scale, growth_tracker


def _positive(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.number)):
        raise TypeError(f"GradScaler {name} must be a number, got {type(value).__name__}")
    if not (math.isfinite(float(value)) and float(value) > 0.0):
        raise ValueError(f"GradScaler {name} must be a finite number > 0, got {value}")
    return float(value)


class GradScaler:
    """``scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()``."""

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16,
                 growth_factor: float = 2.0, backoff_factor: float = 0.5,
                 growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = device_type(device)
        if enabled and self._device == "cuda" and not get_backend("cupy").is_available():
            warnings.warn("GradScaler is enabled, but CUDA is not available; disabling it",
                          stacklevel=2)
            enabled = False
        self._enabled = bool(enabled)
        self._scale = _positive("init_scale", init_scale)
        self._growth_factor = _positive("growth_factor", growth_factor)
        self._backoff_factor = _positive("backoff_factor", backoff_factor)
        if self._growth_factor <= 1.0:
            raise ValueError(f"GradScaler growth_factor must be > 1, got {growth_factor}")
        if self._backoff_factor >= 1.0:
            raise ValueError(f"GradScaler backoff_factor must be < 1, got {backoff_factor}")
        if isinstance(growth_interval, bool) or not isinstance(growth_interval,
                                                               (int, np.integer)):
            raise TypeError(f"GradScaler growth_interval must be an int, got "
                            f"{type(growth_interval).__name__}")
        if growth_interval < 1:
            raise ValueError(f"GradScaler growth_interval must be >= 1, got {growth_interval}")
        self._growth_interval = int(growth_interval)
        self._growth_tracker = 0
        self._per_optimizer: Dict[int, Dict[str, Any]] = {}  # id -> stage, found_inf

    # ------------------------------------------------------------------ scaling
    def scale(self, outputs: Any) -> Any:
        """``outputs * scale``: a tensor, or a list/tuple of them (nested as in torch)."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(output) for output in outputs)
        if not hasattr(outputs, "requires_grad"):
            raise TypeError(f"GradScaler.scale takes a tensor or a list/tuple of tensors, got "
                            f"{type(outputs).__name__}")
        return outputs * self._scale

    def _state_of(self, optimizer: Any) -> Dict[str, Any]:
        return self._per_optimizer.setdefault(id(optimizer),
                                              {"stage": _READY, "found_inf": False})

    def unscale_(self, optimizer: Any) -> None:
        """Divide ``optimizer``'s gradients by the scale in place and note any inf/NaN."""
        if not self._enabled:
            return
        state = self._state_of(optimizer)
        if state["stage"] == _UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since "
                               "the last update().")
        if state["stage"] == _STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        # here, not at the top: importing the package must not import ``optim`` (it is lazy)
        from ..optim.optimizer import parameters_with_grad
        inverse = 1.0 / self._scale
        found_inf = False
        for group_index, group in enumerate(optimizer.param_groups):
            for _, grad in parameters_with_grad(group):
                if grad.dtype == np.float16:
                    raise ValueError(f"Attempting to unscale FP16 gradients (param_groups"
                                     f"[{group_index}], shape {tuple(grad.shape)}).")
                grad *= inverse  # in the gradient's own precision, as torch's kernel does
                found_inf = found_inf or not bool(xp_of(grad).isfinite(grad).all())
        state["found_inf"], state["stage"] = found_inf, _UNSCALED

    def step(self, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        """``optimizer.step(...)`` on unscaled gradients, skipped (returning None) when any
        of them holds an inf or NaN."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is "
                               "enabled.")
        state = self._state_of(optimizer)
        if state["stage"] == _STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] == _READY:
            self.unscale_(optimizer)
        result = None if state["found_inf"] else optimizer.step(*args, **kwargs)
        state["stage"] = _STEPPED
        return result

    def update(self, new_scale: Optional[Any] = None) -> None:
        """Adapt the scale to this iteration's steps, or set it to ``new_scale``."""
        if not self._enabled:
            return
        if new_scale is not None:
            value = new_scale.item() if hasattr(new_scale, "item") else new_scale
            self._scale = _positive("new_scale", value)
        else:
            if not self._per_optimizer:
                raise RuntimeError("No inf checks were recorded prior to update().")
            found_inf = any(state["found_inf"] for state in self._per_optimizer.values())
            self._scale, self._growth_tracker = next_scale(
                self._scale, self._growth_tracker, found_inf, self._growth_factor,
                self._backoff_factor, self._growth_interval)
        self._per_optimizer.clear()

    # ------------------------------------------------------------------ settings
    def get_scale(self) -> float:
        return self._scale if self._enabled else 1.0

    def is_enabled(self) -> bool:
        return self._enabled

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = _positive("growth_factor", new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = _positive("backoff_factor", new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    # ------------------------------------------------------------------ state
    def state_dict(self) -> Dict[str, Any]:
        """torch's keys and values; empty when disabled."""
        if not self._enabled:
            return {}
        return {"scale": self._scale, "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor,
                "growth_interval": self._growth_interval,
                "_growth_tracker": self._growth_tracker}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._scale = _positive("scale", state_dict["scale"])
        self._growth_factor = _positive("growth_factor", state_dict["growth_factor"])
        self._backoff_factor = _positive("backoff_factor", state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._growth_tracker = int(state_dict["_growth_tracker"])

    def __repr__(self) -> str:
        return (f"GradScaler(device={self._device!r}, scale={self._scale}, "
                f"growth_interval={self._growth_interval}, enabled={self._enabled})")
