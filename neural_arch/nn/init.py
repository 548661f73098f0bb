"""In-place parameter initialisers with PyTorch's formulas (drawn from the global generator)."""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from ..backends import backend_for
from ..core.random import get_rng


def _array(tensor: Any) -> Any:
    return getattr(tensor, "array", tensor) if hasattr(tensor, "requires_grad") else tensor


def _fill(tensor: Any, values: np.ndarray) -> Any:
    array = _array(tensor)
    if isinstance(array, np.ndarray):
        array[...] = values
    else:
        array[...] = backend_for(array).asarray(values.astype(array.dtype))
    return tensor


def _rng(generator: Optional[np.random.Generator]) -> np.random.Generator:
    return get_rng() if generator is None else generator


def calculate_fan_in_and_fan_out(tensor: Any) -> Tuple[int, int]:
    """(fan_in, fan_out) of a weight shaped (out, in, *receptive_field)."""
    shape = _array(tensor).shape
    if len(shape) < 2:
        raise ValueError(f"fan in and fan out need a tensor with at least 2 dimensions, got shape "
                         f"{tuple(shape)}")
    receptive = int(np.prod(shape[2:], dtype=np.int64)) if len(shape) > 2 else 1
    return shape[1] * receptive, shape[0] * receptive


def calculate_gain(nonlinearity: str, param: Optional[float] = None) -> float:
    """PyTorch's recommended gain for a nonlinearity."""
    linear = ("linear", "conv1d", "conv2d", "conv3d", "sigmoid", "identity")
    if nonlinearity in linear:
        return 1.0
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        slope = 0.01 if param is None else float(param)
        return math.sqrt(2.0 / (1 + slope ** 2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"unsupported nonlinearity {nonlinearity!r}")


def uniform_(tensor: Any, a: float = 0.0, b: float = 1.0,
             generator: Optional[np.random.Generator] = None) -> Any:
    """Fill with U(a, b)."""
    shape = _array(tensor).shape
    return _fill(tensor, _rng(generator).uniform(a, b, size=shape))


def normal_(tensor: Any, mean: float = 0.0, std: float = 1.0,
            generator: Optional[np.random.Generator] = None) -> Any:
    """Fill with N(mean, std^2)."""
    shape = _array(tensor).shape
    return _fill(tensor, _rng(generator).normal(mean, std, size=shape))


def constant_(tensor: Any, value: float) -> Any:
    return _fill(tensor, np.full(_array(tensor).shape, value))


def zeros_(tensor: Any) -> Any:
    return constant_(tensor, 0.0)


def ones_(tensor: Any) -> Any:
    return constant_(tensor, 1.0)


def xavier_uniform_(tensor: Any, gain: float = 1.0,
                    generator: Optional[np.random.Generator] = None) -> Any:
    """U(-b, b) with ``b = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    bound = gain * math.sqrt(6.0 / (fan_in + fan_out))
    return uniform_(tensor, -bound, bound, generator)


def kaiming_uniform_(tensor: Any, a: float = 0.0, mode: str = "fan_in",
                     nonlinearity: str = "leaky_relu",
                     generator: Optional[np.random.Generator] = None) -> Any:
    """U(-b, b) with ``b = gain * sqrt(3 / fan)``; ``a=sqrt(5)`` gives Linear's default."""
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"mode must be 'fan_in' or 'fan_out', got {mode!r}")
    fan_in, fan_out = calculate_fan_in_and_fan_out(tensor)
    fan = fan_in if mode == "fan_in" else fan_out
    if fan == 0:
        raise ValueError(f"cannot initialise a tensor with zero {mode}, shape "
                         f"{tuple(_array(tensor).shape)}")
    bound = calculate_gain(nonlinearity, a) * math.sqrt(3.0 / fan)
    return uniform_(tensor, -bound, bound, generator)


def affine_default_(weight: Any, bias: Optional[Any] = None,
                    generator: Optional[np.random.Generator] = None) -> None:
    """torch's default initialisation of ``Linear`` and the ``Conv`` layers, in place: weight
    ``kaiming_uniform_(a=sqrt(5))``, i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)), then the bias
    from the same range; a zero fan_in leaves zeros (torch would divide by zero)."""
    fan_in = calculate_fan_in_and_fan_out(weight)[0]
    if fan_in == 0:
        zeros_(weight)
    else:
        kaiming_uniform_(weight, a=math.sqrt(5), generator=generator)
    if bias is not None:
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        uniform_(bias, -bound, bound, generator)
