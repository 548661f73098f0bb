"""torch's dtype names (``torch.long``, ``torch.float``, ``torch.half``, ...).

Tensors hold NumPy arrays, so each name is the NumPy scalar type of the same width:
``t.dtype == torch.long`` and ``zeros(3, dtype=torch.long)`` work because NumPy compares a
dtype equal to its scalar type. This module only assigns names: ``int``, ``float`` and ``bool``
shadow the builtins here, so it holds no code that could need them. ``bfloat16`` is
``ml_dtypes``' NumPy scalar type (see ``bfloat16.py``; a stand-in that raises on use when that
package is not installed).
"""
import numpy as np

from .bfloat16 import bfloat16  # noqa: F401 - torch.bfloat16

float16 = half = np.float16
float32 = float = np.float32
float64 = double = np.float64
uint8 = np.uint8
int8 = np.int8
int16 = short = np.int16
int32 = int = np.int32
int64 = long = np.int64
bool = np.bool_  # noqa: A001 - torch spells it ``torch.bool``
