"""One unit's parameters as a single flat vector: its layout, this rank's shard, and the
buffer the full vector is gathered into.

Layout: the parameters, in registration order, back to back (``entries``), then zeros up to
``padded_numel``, a multiple of the number of shards N, so every shard has ``shard_numel =
padded_numel / N`` elements and rank r's shard is ``flat[r * shard_numel:(r + 1) *
shard_numel]``. The layout without padding does not depend on N, which lets a checkpoint
written on one world size be loaded on another.

The full buffer is a private anonymous memory mapping (page aligned). The original
parameters' ``.array`` are views of it for good: backward closures keep the arrays they
computed with, so dropping references would free nothing while a graph is alive.
``release()`` instead hands the pages back to the operating system
(``madvise(MADV_DONTNEED)``; the views then read zeros) and the next gather writes into the
same addresses, which makes every view valid again. This is what torch does by resizing a
storage to zero.
"""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from typing import Any, List, Sequence, Tuple

import numpy as np


@dataclass(frozen=True)
class FlatEntry:
    """Where one parameter lives in its unit's flat vector (unpadded global layout)."""

    fqn: str
    shape: Tuple[int, ...]
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


class FlatLayout:
    """The parameters of one unit laid out in one flat vector split into ``shards`` pieces."""

    def __init__(self, named_params: Sequence[Tuple[str, Any]], shards: int) -> None:
        self.params = [p for _, p in named_params]
        self.entries: List[FlatEntry] = []
        offset = 0
        for fqn, param in named_params:
            self.entries.append(FlatEntry(fqn, tuple(param.array.shape), offset))
            offset += param.array.size
        self.numel = offset
        self._sizes = [entry.numel for entry in self.entries]
        self.shards = shards
        self.shard_numel = -(-offset // shards)  # ceil: padding goes at the end
        self.padded_numel = self.shard_numel * shards

    def shard_range(self, index: int) -> Tuple[int, int]:
        return index * self.shard_numel, (index + 1) * self.shard_numel

    def flatten(self, arrays: Sequence[Any], dtype: Any) -> np.ndarray:
        """The padded flat vector of ``arrays`` (one per entry; None gives zeros), cast to
        ``dtype``. One concatenation into the vector: this packs every gradient of every
        step, and a Python loop of slice assignments costs more than the copy on models of
        many small parameters (embeddings, norms, biases)."""
        if len(arrays) != len(self.entries):
            raise ValueError(f"FlatLayout.flatten: {len(arrays)} arrays for a layout of "
                             f"{len(self.entries)} parameters")
        flat = np.empty(self.padded_numel, dtype=dtype)
        flat[self.numel:] = 0
        if not self.entries:
            return flat
        pieces = [np.zeros(entry.numel, dtype=dtype) if array is None
                  else np.asarray(array).reshape(-1)
                  for entry, array in zip(self.entries, arrays)]
        if [piece.size for piece in pieces] != self._sizes:
            entry, size = next((e, piece.size) for e, piece in zip(self.entries, pieces)
                               if piece.size != e.numel)
            raise ValueError(f"FlatLayout.flatten: {entry.fqn!r} has {entry.numel} "
                             f"elements (shape {entry.shape}), got {size}")
        np.concatenate(pieces, out=flat[:self.numel], casting="unsafe")
        return flat

    def views(self, flat: np.ndarray) -> List[np.ndarray]:
        """Each parameter's view of a (padded or unpadded) flat vector."""
        return [flat[e.offset:e.offset + e.numel].reshape(e.shape) for e in self.entries]


class GatherBuffer:
    """A flat array of ``numel`` elements whose memory can be returned to the OS and reused."""

    def __init__(self, numel: int, dtype: Any) -> None:
        self.dtype = np.dtype(dtype)
        self.nbytes = numel * self.dtype.itemsize
        # Private: on a shared anonymous mapping MADV_DONTNEED keeps the pages' contents.
        self._map = mmap.mmap(-1, max(self.nbytes, 1),
                              flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.array = np.frombuffer(self._map, dtype=self.dtype, count=numel)

    def release(self) -> None:
        """Give the pages back; the array stays valid and reads zeros until written again."""
        if self.nbytes:
            self._map.madvise(mmap.MADV_DONTNEED)


class GatherStats:
    """Bytes of full parameters gathered now and at peak, over all units of a wrapper, and
    the generation of the shards (bumped whenever they may have changed: an optimizer step
    follows every synchronised backward)."""

    def __init__(self) -> None:
        self.gathered_bytes = 0
        self.peak_gathered_bytes = 0
        self.generation = 0

    def add(self, nbytes: int) -> None:
        self.gathered_bytes += nbytes
        self.peak_gathered_bytes = max(self.peak_gathered_bytes, self.gathered_bytes)

    def remove(self, nbytes: int) -> None:
        self.gathered_bytes -= nbytes
