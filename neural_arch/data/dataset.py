"""Map-style datasets: the ``Dataset`` protocol, in-memory ``TensorDataset``, subsets and splits."""
from __future__ import annotations

import math
import warnings
from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

import numpy as np

from ..core import Tensor
from ..core.random import resolve_rng


class Dataset:
    """A map-style dataset: subclasses define ``__getitem__(index)`` and ``__len__()``.

    A subclass may also define ``_fetch_batch(indices) -> tuple of arrays`` to hand the
    ``DataLoader`` a whole batch at once (much faster than collating item by item).
    """


def _as_array(value: Any) -> np.ndarray:
    # Datasets live in host memory: tensors and CuPy arrays are copied to NumPy.
    if isinstance(value, Tensor):
        return value.numpy()
    if hasattr(value, "__cuda_array_interface__"):
        return value.get()
    return np.asarray(value)


class TensorDataset(Dataset):
    """Rows of several equally long arrays (or tensors); item ``i`` is ``(a[i], b[i], ...)``."""

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("TensorDataset needs at least one array")
        self.arrays: Tuple[np.ndarray, ...] = tuple(_as_array(a) for a in arrays)
        for index, array in enumerate(self.arrays):
            if array.ndim == 0:
                raise ValueError(f"TensorDataset array {index} is a scalar; each array needs a "
                                 f"first axis")
        lengths = [len(a) for a in self.arrays]
        if len(set(lengths)) != 1:
            raise ValueError(f"TensorDataset arrays have different lengths: {lengths}")

    @property
    def tensors(self) -> Tuple[Any, ...]:
        """The arrays as ``Tensor``s (sharing memory where the Tensor constructor allows)."""
        return tuple(Tensor(a, dtype=a.dtype) for a in self.arrays)

    def __getitem__(self, index: int) -> Tuple[np.ndarray, ...]:
        return tuple(a[index] for a in self.arrays)

    def __len__(self) -> int:
        return len(self.arrays[0])

    def _fetch_batch(self, indices: np.ndarray) -> Tuple[np.ndarray, ...]:
        """A whole batch by fancy indexing, instead of collating items one by one."""
        return tuple(a[indices] for a in self.arrays)


class Subset(Dataset):
    """The items of ``dataset`` at ``indices``."""

    def __init__(self, dataset: Any, indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = np.asarray(indices, dtype=np.int64)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[int(self.indices[index])]

    def __len__(self) -> int:
        return len(self.indices)



def batch_fetcher(dataset: Any) -> Optional[Callable[[np.ndarray], Tuple[np.ndarray, ...]]]:
    """``dataset``'s whole-batch fetch function (through subsets), or None if it has none."""
    if isinstance(dataset, Subset):
        inner = batch_fetcher(dataset.dataset)
        if inner is None:
            return None
        return lambda indices: inner(dataset.indices[indices])
    return getattr(dataset, "_fetch_batch", None)


def _split_lengths(total: int, lengths: Sequence[Union[int, float]]) -> List[int]:
    if math.isclose(sum(lengths), 1) and sum(lengths) <= 1:
        # Fractions (torch's rule, so [1, 0] is one too): floor each, then hand the remainder
        # out round-robin.
        for index, fraction in enumerate(lengths):
            if not 0 <= fraction <= 1:
                raise ValueError(f"Fraction at index {index} is not between 0 and 1: "
                                 f"{fraction!r} in lengths {list(lengths)}")
        counts = [int(math.floor(total * fraction)) for fraction in lengths]
        for i in range(total - sum(counts)):
            counts[i % len(counts)] += 1
        for index, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"Length of split at index {index} is 0. This might result in an "
                              f"empty dataset.")
    elif all(isinstance(x, (int, np.integer)) for x in lengths):
        counts = [int(x) for x in lengths]
    else:
        raise ValueError(f"lengths must be integers or fractions summing to 1, got {list(lengths)}")
    if any(c < 0 for c in counts) or sum(counts) != total:
        raise ValueError(
            f"split lengths {counts} do not add up to the dataset length {total}")
    return counts


def random_split(dataset: Any, lengths: Sequence[Union[int, float]],
                 generator: Optional[np.random.Generator] = None, *,
                 seed: Optional[int] = None) -> List[Subset]:
    """Split into non-overlapping random subsets of the given lengths (or fractions summing to
    1), as torch: each call draws a new split from the global generator (``manual_seed``) unless
    ``generator`` (a ``numpy.random.Generator``) or ``seed`` fixes it."""
    if generator is not None and not isinstance(generator, np.random.Generator):
        raise TypeError(f"generator must be a numpy.random.Generator, got "
                        f"{type(generator).__name__}")
    total = len(dataset)
    counts = _split_lengths(total, lengths)
    order = resolve_rng(seed, generator).permutation(total)
    bounds = np.cumsum([0] + counts)
    return [Subset(dataset, order[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
