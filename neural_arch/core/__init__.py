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

# torch's namespace. These `randn`, `rand` and `where` replace the ones imported above: they
# take torch's extra arguments (generator=, the one-argument `where`) and otherwise delegate.
from .creation import empty_like, full_like, linspace  # noqa: E402
from .generator import Generator  # noqa: E402
from .ops_einsum import einsum  # noqa: E402
from .ops_norm import norm  # noqa: E402
from .ops_select import argsort, sort, topk, tril, triu, where  # noqa: E402,F811
from .sampling import (multinomial, rand, rand_like, randint, randn, randn_like,  # noqa: E402
                       randperm)  # noqa: F811
from .torch_device import device  # noqa: E402
from .torch_size import Size  # noqa: E402
from .torch_utilities import allclose, inference_mode, numel  # noqa: E402

concat = concatenate

__all__ += [
    "empty_like", "full_like", "linspace", "Generator", "einsum", "argsort", "sort", "topk",
    "norm", "tril", "triu", "multinomial", "rand_like", "randint", "randn_like", "randperm",
    "device",
    "allclose", "inference_mode", "numel", "concat",
    "Size",
]
