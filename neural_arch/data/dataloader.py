"""Mini-batch iteration over a dataset, with reproducible per-epoch shuffling."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

import numpy as np

from ..core import Tensor
from ..core.random import get_rng
from .dataset import batch_fetcher
from .worker_pool import WorkerPool, get_context


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
                          persistent_workers: bool, worker_init_fn: Any) -> Optional[int]:
    """Validate torch's worker options; the prefetch factor to use (2 per worker by default)."""
    if isinstance(num_workers, bool) or not isinstance(num_workers, (int, np.integer)) \
            or num_workers < 0:
        raise ValueError(f"num_workers must be a non-negative integer, got {num_workers!r}")
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"worker_init_fn must be callable, got {type(worker_init_fn).__name__}")
    if num_workers == 0:
        if timeout != 0:
            raise ValueError(f"timeout={timeout!r} applies to worker processes; with "
                             f"num_workers=0 it must be 0")
        if prefetch_factor is not None:
            raise ValueError(f"prefetch_factor={prefetch_factor!r} applies to worker processes; "
                             f"with num_workers=0 leave it None")
        if persistent_workers:
            raise ValueError("persistent_workers=True needs worker processes (num_workers > 0); "
                             "with num_workers=0 leave it False")
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout must be a non-negative number of seconds, got {timeout!r}")
    if prefetch_factor is None:
        return 2
    if isinstance(prefetch_factor, bool) or not isinstance(prefetch_factor, (int, np.integer)) \
            or prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be a positive integer, got {prefetch_factor!r}")
    return int(prefetch_factor)


def _arrays_to_tensors(arrays: Sequence[np.ndarray]) -> tuple:
    return tuple(_to_tensor(a) for a in arrays)


def _unchanged(batch: Any) -> Any:
    return batch


class DataLoader:
    """Iterate over ``dataset`` in batches of ``batch_size``.

    ``shuffle`` draws a new permutation every epoch (each ``iter()`` is an epoch); with ``seed``
    the sequence of permutations is reproducible, without it the framework's global generator
    (``manual_seed``) is used. ``sampler`` is any iterable of indices with ``__len__`` (for
    example ``DistributedSampler``) and excludes ``shuffle``.

    ``num_workers > 0`` makes batches in that many worker processes, with torch's semantics
    (see ``worker_pool``): the sampler runs here, so the batches and their order are those of
    ``num_workers=0``; ``prefetch_factor`` batches per worker are in flight (default 2);
    ``worker_init_fn(worker_id)`` runs once in each worker after it is seeded with
    ``base_seed + worker_id`` (``random``, NumPy's global generator and ``manual_seed``; the base
    seed comes from ``seed`` and the epoch, or from the global generator without disturbing
    its draws); ``get_worker_info()`` tells a dataset which worker it runs in;
    ``persistent_workers`` keeps the workers from one epoch to the next; ``timeout`` (seconds,
    0 = none) bounds the wait for one batch; ``multiprocessing_context`` is ``"fork"`` by
    default (as torch on Linux) or ``"spawn"`` (dataset and functions must then be picklable).
    A worker's exception is raised here naming the worker, with its traceback; a worker that
    dies is a ``RuntimeError`` naming it and its signal or exit code. A dataset with
    ``_fetch_batch``, as ``TensorDataset``, builds a whole batch with one indexing and seldom
    gains from workers. ``pin_memory`` changes nothing (batches are host arrays, moved by
    ``.to(device)``). Without workers, as in torch, the worker options are refused and
    ``worker_init_fn`` is never called.
    """

    def __init__(self, dataset: Any, batch_size: int = 1, shuffle: bool = False,
                 sampler: Optional[Iterable[int]] = None, drop_last: bool = False,
                 seed: Optional[int] = None, collate_fn: Optional[Callable[[List[Any]], Any]] = None,
                 num_workers: int = 0, pin_memory: bool = False, timeout: float = 0,
                 worker_init_fn: Optional[Callable[[int], None]] = None,
                 prefetch_factor: Optional[int] = None, persistent_workers: bool = False,
                 multiprocessing_context: Any = None) -> None:
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)) \
                or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
        self.prefetch_factor = _check_worker_options(num_workers, timeout, prefetch_factor,
                                                     persistent_workers, worker_init_fn)
        self.num_workers, self.pin_memory = int(num_workers), bool(pin_memory)
        self.timeout, self.worker_init_fn = timeout, worker_init_fn
        self.persistent_workers = bool(persistent_workers)
        self.multiprocessing_context = (get_context(multiprocessing_context)
                                        if self.num_workers else multiprocessing_context)
        self._persistent_pool: Optional[WorkerPool] = None
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

    def _batch_index_lists(self, indices: np.ndarray) -> List[np.ndarray]:
        stop = len(indices) - len(indices) % self.batch_size if self.drop_last else len(indices)
        return [indices[start:start + self.batch_size]
                for start in range(0, stop, self.batch_size)]

    def worker_options(self) -> Dict[str, Any]:
        """The worker settings as keyword arguments, for a loader rebuilt over the same data
        (with a sampler of its own, say) that must make its batches the same way."""
        if not self.num_workers:
            return {"pin_memory": self.pin_memory}
        return {"num_workers": self.num_workers, "pin_memory": self.pin_memory,
                "timeout": self.timeout, "worker_init_fn": self.worker_init_fn,
                "prefetch_factor": self.prefetch_factor,
                "persistent_workers": self.persistent_workers,
                "multiprocessing_context": self.multiprocessing_context}

    def __iter__(self) -> Iterator[Any]:
        if self.num_workers == 0:
            return self._batches_in_this_process()
        epoch = self.epoch
        batches = self._batch_index_lists(self._indices())
        self.epoch += 1
        pool = self._persistent_pool
        if pool is None or pool.closed:
            pool = self._start_workers(epoch)
            if self.persistent_workers:
                self._persistent_pool = pool
        pool.start_epoch(batches)
        return pool

    def _base_seed(self, epoch: int) -> int:
        """Workers' base seed: from ``seed`` and the epoch, else from the global generator by
        spawning a child, which leaves the generator's own draws (the shuffles) unchanged."""
        if self.seed is not None:
            source = np.random.default_rng((self.seed, epoch, 1))
        else:
            generator = get_rng()
            source = generator.spawn(1)[0] if hasattr(generator, "spawn") else generator
        return int(source.integers(2 ** 62))

    def _start_workers(self, epoch: int) -> WorkerPool:
        fetch = batch_fetcher(self.dataset) if self.collate_fn is None else None
        collate = None if fetch is not None else (self.collate_fn or default_collate)
        return WorkerPool(self.dataset, collate, self.num_workers, self.prefetch_factor,
                          self.timeout, self.worker_init_fn, self._base_seed(epoch),
                          self.multiprocessing_context,
                          _arrays_to_tensors if fetch is not None else _unchanged,
                          persistent=self.persistent_workers)

    def _batches_in_this_process(self) -> Iterator[Any]:
        indices = self._indices()
        self.epoch += 1
        fetch = batch_fetcher(self.dataset) if self.collate_fn is None else None
        for batch in self._batch_index_lists(indices):
            if fetch is not None:
                yield _arrays_to_tensors(fetch(batch))
            else:
                samples = [self.dataset[int(i)] for i in batch]
                yield (self.collate_fn or default_collate)(samples)

    def __len__(self) -> int:
        n = len(self.sampler) if self.sampler is not None else len(self.dataset)
        return n // self.batch_size if self.drop_last else math.ceil(n / self.batch_size)
