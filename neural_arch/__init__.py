"""Neural Forge: a small deep-learning framework on NumPy with its own collective layer.

Importing the package loads only the tensor core, ``functional`` and ``save`` / ``load``
(``serialization``); the subpackages ``nn``, ``optim``, ``data``, ``models``, ``utils`` and
``distributed`` are imported on first attribute access.
"""
from __future__ import annotations

import importlib
from typing import Any

from . import functional
from .amp import autocast  # torch.autocast; also makes neural_arch.amp an attribute
from .backends import default_device, set_default_device
from .core import (Tensor, arange, cat, concatenate, enable_grad, eye, from_numpy, full,
                   get_rng, gradcheck, is_grad_enabled, manual_seed, no_grad, ones, ones_like,
                   rand, randn, set_grad_enabled, stack, tensor, where, zeros, zeros_like)
from .core.dtypes import bool_, float16, float32, float64, int32, int64
from .serialization import load, save
# torch's namespace (`import neural_arch as torch`); `int`, `float` and `bool` are dtypes from
# here on, so this module's code below must not use them as the builtins
from .core import (Generator, allclose, argsort, concat, device, einsum, empty_like, full_like,
                   inference_mode, linspace, multinomial, norm, numel, rand_like, randint,
                   randn_like, randperm, sort, topk, tril, triu)
from .core.torch_size import Size
from .core.torch_dtypes import (bfloat16, bool, double, float, half, int, int8, int16, long,
                                short, uint8)
from . import cuda  # torch.cuda: GPUs through CuPy
from .backends import get_num_threads, set_num_threads
from .core.ops_extremes import argmax, argmin, max, maximum, min, minimum
from .core.tensor_torch_extras import narrow
from .core.torch_memory_format import (channels_last, channels_last_3d, contiguous_format,
                                       memory_format, preserve_format)

__version__ = "0.1.0"

_LAZY_SUBPACKAGES = ("nn", "optim", "data", "models", "utils", "distributed", "functional",
                     "backends")


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBPACKAGES:
        module = importlib.import_module(f"{__name__}.{name}")
        globals()[name] = module
        return module
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(_LAZY_SUBPACKAGES))


__all__ = [
    "Tensor", "no_grad", "enable_grad", "set_grad_enabled", "is_grad_enabled", "gradcheck",
    "concatenate", "cat", "stack", "where", "tensor", "zeros", "ones", "full", "eye", "randn",
    "rand", "arange", "zeros_like", "ones_like", "from_numpy", "manual_seed", "get_rng",
    "default_device", "set_default_device", "functional", "float16", "float32", "float64",
    "int32", "int64", "bool_", "save", "load", "__version__",
]
__all__ += [  # the dtype names stay out: `import *` must not shadow int, float and bool
    "Generator", "allclose", "argsort", "concat", "device", "einsum", "empty_like", "full_like",
    "inference_mode", "linspace", "multinomial", "norm", "numel", "rand_like", "randint",
    "randn_like",
    "randperm", "sort", "topk", "tril", "triu", "uint8", "int8", "int16",
    "Size",
]
__all__ += [  # `max` and `min` stay out, as the dtype names: they would shadow the builtins
    "cuda", "get_num_threads", "set_num_threads", "argmax", "argmin", "maximum", "minimum",
    "narrow",
]
__all__ += ["memory_format", "contiguous_format", "channels_last", "channels_last_3d",
            "preserve_format"]
