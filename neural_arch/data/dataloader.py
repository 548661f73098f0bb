"""Mini-batch iteration over a dataset, with reproducible per-epoch shuffling."""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from ..core import Tensor
from ..core.random import get_rng
from .dataset import batch_fetcher


def _to_tensor(array: np.ndarray) -> Tensor:
    return Tensor(array, dtype=array.dtype)


def default_collate(samples: Sequence[Any]) -> Any:
    """Stack a list of samples field by field into ``Tensor``s, keeping dtypes.

    Tuples and lists collate per position, dicts per key, strings into a list; Python floats
    become float32 (the framework's default float) and Python ints int64.
    """
    first = samples[0]
    if isinstance(first, (tuple, list)):
        sizes = {len(s) for s in samples}
        if len(sizes) != 1:
            raise ValueError(f"samples of one batch have different numbers of fields: "
                             f"{sorted(sizes)}")
        fields = [default_collate([s[i] for s in samples]) for i in range(len(first))]
        return tuple(fields) if isinstance(first, tuple) else fields
    if isinstance(first, dict):
        return {key: default_collate([s[key] for s in samples]) for key in first}
    if isinstance(first, (str, bytes)):
        return list(samples)
    if not isinstance(first, np.generic):  # NumPy scalars keep their dtype below
        if isinstance(first, bool):
            return _to_tensor(np.asarray(samples, dtype=np.bool_))
        if isinstance(first, float):
            return _to_tensor(np.asarray(samples, dtype=np.float32))
        if isinstance(first, int):
            return _to_tensor(np.asarray(samples, dtype=np.int64))
    arrays = [s.numpy() if isinstance(s, Tensor) else np.asarray(s) for s in samples]
    shapes = {a.shape for a in arrays}
    if len(shapes) != 1:
        raise ValueError(f"cannot stack samples of different shapes into a batch: {sorted(shapes)}")
    return _to_tensor(np.stack(arrays))


def _check_worker_options(num_workers: Any, timeout: Any, prefetch_factor: Any,
                          persistent_workers: bool) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) \
            or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative integer, got {num_workers!r}")
    if num_workers > 0:
        raise ValueError(f"DataLoader(num_workers={num_workers}): worker processes are not "
                         f"supported; use num_workers=0 (batches are made in the training "
                         f"process; a TensorDataset, or a dataset with _fetch_batch, fetches a "
                         f"whole batch with one indexing)")
    if timeout != 0:
        raise ValueError(f"timeout={timeout!r} applies to worker processes; with "
                         f"num_workers=0 it must be 0")
    if prefetch_factor is not None:
        raise ValueError(f"prefetch_factor={prefetch_factor!r} applies to worker processes; "
                         f"with num_workers=0 leave it None")
    if persistent_workers:
        raise ValueError("persistent_workers=True needs worker processes (num_workers > 0); "
                         "with num_workers=0 leave it False")


class DataLoader:
    """Iterate over ``dataset`` in batches of ``batch_size``.

    ``shuffle`` draws a new permutation every epoch (each ``iter()`` is an epoch); with ``seed``
    the sequence of permutations is reproducible, without it the framework's global generator
    (``manual_seed``) is used. ``sampler`` is any iterable of indices with ``__len__`` (for
    example ``DistributedSampler``) and excludes ``shuffle``.

    torch's loading options are accepted so that ported scripts run unchanged: batches are
    always made in this process (``num_workers=0``; a dataset with ``_fetch_batch``, as
    ``TensorDataset``, builds a whole batch with one indexing and needs no workers), and
    ``pin_memory`` changes nothing (batches are host arrays, moved by ``.to(device)``).
    ``persistent_workers``, ``prefetch_factor`` and ``timeout`` concern workers, so, as in
    torch, they are refused without them; ``worker_init_fn`` is never called.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 sampler: Optional[Iterable[int]] = None, drop_last: bool = False,
                 seed: Optional[int] = None, collate_fn: Optional[Callable[[List[Any]], Any]] = None,
                 num_workers: int = 0, pin_memory: bool = False, timeout: float = 0,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 prefetch_factor: Optional[int] = None, persistent_workers: bool = False
                 ) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        _check_worker_options(num_workers, timeout, prefetch_factor, persistent_workers)
        self.num_workers, self.pin_memory = 0, bool(pin_memory)
        if sampler is not None and shuffle:
            raise ValueError("sampler and shuffle=True are mutually exclusive")
        if sampler is not None and not hasattr(sampler, "__len__"):
            raise TypeError(f"sampler must define __len__, got {type(sampler).__name__}")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.sampler, self.drop_last = shuffle, sampler, drop_last
        self.seed, self.collate_fn = seed, collate_fn
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Choose which epoch's shuffle the next iteration uses (for resuming)."""
        self.epoch = int(epoch)

    def _indices(self) -> np.ndarray:
        if self.sampler is not None:
            return np.fromiter((int(i) for i in self.sampler), dtype=np.int64)
        n = len(self.dataset)
        if not self.shuffle:
            return np.arange(n, dtype=np.int64)
        rng = get_rng() if self.seed is None else np.random.default_rng((self.seed, self.epoch))
        return rng.permutation(n).astype(np.int64, copy=False)

    def __iter__(self) -> Iterator[Any]:
        indices = self._indices()
        self.epoch += 1
        fetch = batch_fetcher(self.dataset) if self.collate_fn is None else None
        stop = len(indices) - len(indices) % self.batch_size if self.drop_last else len(indices)
        for start in range(0, stop, self.batch_size):
            batch = indices[start:start + self.batch_size]
            if fetch is not None:
                yield tuple(_to_tensor(a) for a in fetch(batch))
            else:
                samples = [self.dataset[int(i)] for i in batch]
                yield (self.collate_fn or default_collate)(samples)

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
