"""Tensors, automatic differentiation and tensor factories."""
from .dtypes import bool_, float16, float32, float64, int32, int64
from .factories import (arange, eye, from_numpy, full, ones, ones_like, rand, randn, tensor,
                        zeros, zeros_like)
from .grad_mode import enable_grad, is_grad_enabled, no_grad, set_grad_enabled
from .gradcheck import gradcheck
from .broadcast import unbroadcast
from .ops_shape import concatenate, stack, where
from .random import get_rng, manual_seed
from .tensor import Tensor

cat = concatenate

__all__ = [
    "Tensor", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "gradcheck",
    "concatenate", "cat", "stack", "where", "tensor", "zeros", "ones", "full", "eye", "randn",
    "rand", "arange", "zeros_like", "ones_like", "from_numpy", "manual_seed", "get_rng",
    "unbroadcast", "float16", "float32", "float64", "int32", "int64", "bool_",
]
