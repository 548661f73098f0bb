"""All parameters as one flat vector, and back (torch's ``parameters_to_vector`` and
``vector_to_parameters``)."""
from __future__ import annotations

from typing import Any, Iterable

from ...core import Tensor
from ...core.ops_shape import concatenate

__all__ = ["parameters_to_vector", "vector_to_parameters"]


def parameters_to_vector(parameters: Iterable[Any]) -> Tensor:
    """The parameters flattened and joined in order; differentiable, as PyTorch's."""
    flat = [p.reshape(-1) for p in parameters]
    if not flat:
        raise ValueError("parameters_to_vector: no parameters given")
    return concatenate(flat, axis=0)


def vector_to_parameters(vec: Tensor, parameters: Iterable[Any]) -> None:
    """Copy consecutive slices of the 1-d ``vec`` into the parameters, in place (they keep
    their identity, dtype and device, so optimizers holding them stay valid)."""
    if not isinstance(vec, Tensor):
        raise TypeError(f"vector_to_parameters: expected a Tensor, got {type(vec).__name__}")
    parameters = list(parameters)
    needed = sum(p.array.size for p in parameters)
    if vec.array.ndim != 1 or vec.array.size != needed:
        raise ValueError(f"vector_to_parameters: vec of shape {tuple(vec.array.shape)} does not "
                         f"match the parameters' {needed} elements")
    offset = 0
    for param in parameters:
        count = param.array.size
        param.array[...] = vec.array[offset:offset + count].reshape(param.array.shape)
        offset += count
