"""Arrays of a few parameters back to back in one flat host buffer: where each lies, and the
copies in and out. ZeRO's layouts use it: the updated parameters an owner passes on under
``overlap_with_ddp`` (a buffer kept from step to step, or its copy of a shared DDP bucket), and
the gradients ``FlatShards`` reduce-scatters.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import numpy as np

from ..buffers import copy_from_host, copy_into_host


class BackToBack:
    """The layout of ``params`` (one dtype) back to back: parameter ``j`` holds elements
    ``offsets[j]:offsets[j + 1]``; ``numel`` in all."""

    def __init__(self, params: Sequence[Any]) -> None:
        self.params = list(params)
        sizes = [p.array.size for p in self.params]
        self.offsets: List[int] = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self.numel = self.offsets[-1]
        self.dtype = np.dtype(self.params[0].array.dtype) if self.params else None

    def empty(self) -> np.ndarray:
        """A host buffer for the layout (allocate once, reuse every step)."""
        return np.empty(self.numel, dtype=self.dtype)

    def _check(self, flat: np.ndarray, what: str) -> None:
        if flat.ndim != 1 or flat.size != self.numel or flat.dtype != self.dtype:
            raise ValueError(f"{what}: the buffer holds {flat.size} x {flat.dtype} "
                             f"(shape {flat.shape}), the {len(self.params)} parameters need a "
                             f"flat {self.numel} x {self.dtype}")

    def pack(self, arrays: Sequence[Optional[Any]], flat: np.ndarray) -> None:
        """``arrays[j]`` (host or GPU, shaped like parameter ``j``; None: zeros) into ``flat``."""
        self._check(flat, "BackToBack.pack")
        for array, lo, hi in zip(arrays, self.offsets, self.offsets[1:]):
            if array is None:
                flat[lo:hi] = 0
            else:
                copy_into_host(flat[lo:hi], array)

    def pack_values(self, flat: np.ndarray) -> None:
        """The parameters' current values into ``flat``."""
        self.pack([p.array for p in self.params], flat)

    def unpack_values(self, flat: np.ndarray) -> None:
        """``flat`` into the parameters' values, in place (their storage stays theirs)."""
        self._check(flat, "BackToBack.unpack_values")
        for p, lo, hi in zip(self.params, self.offsets, self.offsets[1:]):
            copy_from_host(flat[lo:hi].reshape(p.array.shape), p.array, out=p.array)
            p.mark_modified_in_place()  # written in place: autograd's version counter moves


__all__ = ["BackToBack"]
