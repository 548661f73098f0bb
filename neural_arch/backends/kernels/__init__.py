"""CUDA kernel sources and the table of their entry points.

Each ``.cu`` file here holds plain ``extern "C" __global__`` kernels and no host code, so
``nvcc -ptx -arch=sm_90 FILE.cu`` compiles it on its own and CuPy's ``RawModule`` compiles the
same text at run time. ``KERNELS`` names every entry point with its file and the C types of its
parameters; ``pack_args`` turns Python values into exactly those types, because CuPy would pass
a Python ``int`` as a 64-bit integer and a ``float`` as a double whatever the kernel expects.
Nothing here imports CuPy.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Dict, NamedTuple, Tuple

import numpy as np

KERNEL_DIR = Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"\s*$', re.MULTILINE)
_PRAGMA_ONCE = re.compile(r"^\s*#\s*pragma\s+once\s*$", re.MULTILINE)

# Parameter kinds: a device pointer (an array), or a scalar of a fixed C type.
PTR, I32, I64, F32 = "ptr", "i32", "i64", "f32"
_SCALAR_TYPES = {I32: np.int32, I64: np.int64, F32: np.float32}
# How each kind appears in PTX (``.param .u64 name``): what the source check compares.
PTX_TYPES = {PTR: "u64", I64: "u64", I32: "u32", F32: "f32"}


class Kernel(NamedTuple):
    source: str             # file name in KERNEL_DIR
    params: Tuple[str, ...]  # parameter kinds, in order


_P, _G = (PTR,) * 3, (PTR,) * 4
KERNELS: Dict[str, Kernel] = {
    "bias_gelu_erf_forward": Kernel("gelu.cu", _P + (I64, I32)),
    "bias_gelu_tanh_forward": Kernel("gelu.cu", _P + (I64, I32)),
    "bias_gelu_erf_backward": Kernel("gelu.cu", _G + (I64, I32)),
    "bias_gelu_tanh_backward": Kernel("gelu.cu", _G + (I64, I32)),
    "softmax_cross_entropy_forward": Kernel("cross_entropy.cu", _G + (I32, I32, I64, F32)),
    "softmax_cross_entropy_backward": Kernel("cross_entropy.cu",
                                             _G + (PTR, I32, I32, I64, F32)),
    "layer_norm_forward": Kernel("layer_norm.cu", _G + (PTR, PTR, I32, I32, F32)),
    "layer_norm_backward_input": Kernel("layer_norm.cu", _G + (PTR, PTR, I32, I32)),
    "layer_norm_backward_params": Kernel("layer_norm.cu", _G + (PTR, PTR, I32, I32, I32)),
    "adamw_multi_tensor": Kernel("adamw.cu", (PTR,) * 7 + (I32,) + (F32,) * 7 + (I32,)),
    "unscale_check_inf_f32": Kernel("unscale.cu", (PTR, I64, F32, PTR)),
    "unscale_check_inf_f16": Kernel("unscale.cu", (PTR, I64, F32, PTR)),
}


def source_files() -> list:
    """Every ``.cu`` file of the package, sorted."""
    return sorted(KERNEL_DIR.glob("*.cu"))


def source(name: str) -> str:
    """The text of ``name`` with local ``#include "..."`` lines replaced by the header's text.

    Inlining keeps the compiled text self-contained, so CuPy's compile cache (keyed on the
    source text) can never serve a kernel built against an older header.
    """
    path = KERNEL_DIR / name
    if path.parent != KERNEL_DIR or not path.is_file():
        raise ValueError(f"no kernel source {name!r} in the kernels package; have "
                         f"{[p.name for p in source_files()]}")
    return _inline(path, seen=set())


def _inline(path: Path, seen: set) -> str:
    if path in seen:  # a header included twice: #pragma once semantics
        return ""
    seen.add(path)
    text = _PRAGMA_ONCE.sub("", path.read_text(encoding="utf-8"))

    def replace(match: "re.Match[str]") -> str:
        header = KERNEL_DIR / match.group(1)
        if not header.is_file():
            raise ValueError(f"{path.name} includes {match.group(1)!r}, which is not in the "
                             "kernels package")
        return _inline(header, seen)

    return _INCLUDE.sub(replace, text)


def pack_args(name: str, args: Tuple[Any, ...]) -> Tuple[Any, ...]:
    """``args`` for kernel ``name`` with every scalar cast to the C type its parameter has."""
    try:
        kernel = KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; known: {sorted(KERNELS)}") from None
    if len(args) != len(kernel.params):
        raise TypeError(f"kernel {name} takes {len(kernel.params)} arguments "
                        f"{kernel.params}, got {len(args)}")
    packed = []
    for index, (kind, value) in enumerate(zip(kernel.params, args)):
        if kind == PTR:
            if not hasattr(value, "data") or not hasattr(value, "dtype"):
                raise TypeError(f"kernel {name} argument {index} must be a device array, got "
                                f"{type(value).__name__}")
            packed.append(value)
        else:
            if isinstance(value, bool) or not np.isscalar(value):
                raise TypeError(f"kernel {name} argument {index} must be a {kind} scalar, got "
                                f"{value!r}")
            scalar_type = _SCALAR_TYPES[kind]
            if kind != F32:
                if not isinstance(value, (int, np.integer)):
                    raise TypeError(f"kernel {name} argument {index} must be an integer "
                                    f"({kind}), got {value!r}")
                info = np.iinfo(scalar_type)
                if not info.min <= int(value) <= info.max:
                    raise ValueError(f"kernel {name} argument {index} = {value} does not fit "
                                     f"in {kind}")
            packed.append(scalar_type(value))
    return tuple(packed)


def kernels_in(source_name: str) -> list:
    """Names of the table's kernels that live in ``source_name``."""
    return sorted(name for name, k in KERNELS.items() if k.source == source_name)


__all__ = ["KERNELS", "KERNEL_DIR", "Kernel", "PTX_TYPES", "kernels_in", "pack_args", "source",
           "source_files"]
