"""Compare autograd gradients with central finite differences in float64."""
from __future__ import annotations

from typing import Any, Callable, Sequence, Union

import numpy as np

from .grad_mode import enable_grad, no_grad
from .tensor import Tensor


def _outputs(result: Any) -> list:
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [t for t in items if isinstance(t, Tensor) and t.array.dtype.kind == "f"]


def _weighted_total(outputs: list, weights: list) -> Any:
    total = None
    for out, w in zip(outputs, weights):
        term = (out * w).sum()
        total = term if total is None else total + term
    return total


def gradcheck(fn: Callable[..., Any], inputs: Union[Tensor, Sequence[Any]], eps: float = 1e-6,
              atol: float = 1e-5, rtol: float = 1e-3, raise_exception: bool = True) -> bool:
    """Check ``fn(*inputs)``'s vector-Jacobian product for each input that requires grad.

    Inputs are promoted to float64 (the callers' tensors and their ``.grad`` are left as they
    were). The outputs are contracted with fixed random
    weights, so one backward pass checks every input element against a central difference.
    Raises AssertionError naming the input index, element index, analytic and numeric values.
    """
    originals = [inputs] if isinstance(inputs, Tensor) else list(inputs)
    args = []
    for value in originals:
        if isinstance(value, Tensor) and value.array.dtype.kind == "f":
            # float64 data is shared (strides kept; perturbations are undone), others are copied
            data = value.numpy()
            data = data if data.dtype == np.float64 else data.astype(np.float64)
            args.append(Tensor(data, requires_grad=value.requires_grad))
        else:
            args.append(value)
    checked = [i for i, a in enumerate(args) if isinstance(a, Tensor) and a.requires_grad]
    if not checked:
        raise ValueError("gradcheck needs at least one floating input with requires_grad=True")

    with enable_grad():
        outputs = _outputs(fn(*args))
        if not outputs:
            raise ValueError("gradcheck: fn returned no floating tensor")
        rng = np.random.default_rng(12345)
        weights = [rng.uniform(0.5, 1.5, out.array.shape) * rng.choice([-1.0, 1.0], out.array.shape)
                   for out in outputs]
        total = _weighted_total(outputs, weights)
        if not total.requires_grad:
            raise ValueError("gradcheck: the output does not depend on an input that "
                             "requires grad")
        for i in checked:
            args[i].grad = None
        total.backward()

    for i in checked:
        tensor = args[i]
        analytic = tensor.grad.array if tensor.grad is not None else np.zeros_like(tensor.array)
        data = tensor.array  # perturbed in place, element by element (it may be a strided view)
        for position in np.ndindex(*data.shape):
            saved = data[position]
            with no_grad():
                data[position] = saved + eps
                plus = _weighted_total(_outputs(fn(*args)), weights).item()
                data[position] = saved - eps
                minus = _weighted_total(_outputs(fn(*args)), weights).item()
            data[position] = saved
            numeric = (plus - minus) / (2 * eps)
            value = float(analytic[position])
            if not abs(value - numeric) <= atol + rtol * abs(numeric):
                if not raise_exception:
                    return False
                raise AssertionError(
                    f"gradcheck failed for input {i} at element {position}: analytic {value!r}, "
                    f"numeric {numeric!r} (atol {atol}, rtol {rtol})")
    return True
