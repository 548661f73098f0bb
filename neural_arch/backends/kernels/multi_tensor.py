"""Host-side bookkeeping for kernels that update many tensors in one launch.

A multi-tensor launch gives each block one contiguous chunk of one tensor: ``chunk_table``
lists, per block, which tensor and which start offset. It is pure NumPy, so its coverage
(every element of every tensor exactly once) is checked on the CPU.
"""
from __future__ import annotations

from typing import Sequence, Tuple

import numpy as np

# Elements per block: 256 threads x 16 elements keeps each block streaming long enough to hide
# its start-up, while a 1k-element bias still costs only one block.
CHUNK = 4096
MAX_BLOCKS = 2 ** 31 - 1  # CUDA's limit on gridDim.x


def chunk_table(sizes: Sequence[int], chunk: int = CHUNK) -> Tuple[np.ndarray, np.ndarray]:
    """(block_tensor int32, block_start int64): block b updates tensor ``block_tensor[b]`` from
    element ``block_start[b]`` up to ``chunk`` elements. Empty tensors get no block."""
    if chunk <= 0:
        raise ValueError(f"chunk must be positive, got {chunk}")
    counts = []
    for i, size in enumerate(sizes):
        if size < 0:
            raise ValueError(f"tensor {i} has negative size {size}")
        counts.append(-(-int(size) // chunk))
    total = int(sum(counts))
    if total > MAX_BLOCKS:
        raise ValueError(f"{total} blocks exceed CUDA's grid limit of {MAX_BLOCKS}; split the "
                         "tensor list")
    if len(sizes) > np.iinfo(np.int32).max:
        raise ValueError(f"{len(sizes)} tensors exceed the int32 tensor index")
    block_tensor = np.repeat(np.arange(len(sizes), dtype=np.int32), counts)
    first_block = np.cumsum([0] + counts[:-1]) if counts else np.zeros(0, dtype=np.int64)
    within = np.arange(total, dtype=np.int64) - np.repeat(np.asarray(first_block, np.int64),
                                                          counts)
    return block_tensor, within * chunk


def pointer_table(*tensor_lists: Sequence[object]) -> np.ndarray:
    """(len(tensor_lists), tensors) uint64 array of device pointers (``array.data.ptr``)."""
    return np.array([[a.data.ptr for a in arrays] for arrays in tensor_lists], dtype=np.uint64)
