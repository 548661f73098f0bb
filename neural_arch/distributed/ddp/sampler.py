"""DistributedSampler: each rank draws a disjoint, equal-sized share of a dataset's indices.

Semantics follow PyTorch: the shuffle depends only on ``seed + epoch`` so every rank computes
the same permutation without talking to the others; the index list is padded by repeating it
from the start (or cut, with ``drop_last``) to a multiple of the number of replicas; rank ``r``
takes ``indices[r::num_replicas]``.
"""
from __future__ import annotations

import math
from typing import Any, Dict, Iterator, Optional

import numpy as np


def _dataset_length(source: Any) -> int:
    if isinstance(source, (int, np.integer)) and not isinstance(source, bool):
        return int(source)
    if hasattr(source, "__len__"):
        return len(source)
    raise TypeError(f"DistributedSampler needs a dataset size (int) or a dataset with __len__, "
                    f"got {type(source).__name__}")


class DistributedSampler:
    """Indices of this rank's share of a dataset, reshuffled each epoch by ``set_epoch``."""

    def __init__(self, dataset_size_or_dataset: Any = None, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, *, dataset_size: Optional[int] = None,
                 dataset: Any = None) -> None:
        given = [s for s in (dataset_size_or_dataset, dataset_size, dataset) if s is not None]
        if len(given) != 1:
            raise TypeError("pass exactly one of dataset_size_or_dataset, dataset_size= or dataset=")
        self.dataset_size = _dataset_length(given[0])
        if self.dataset_size < 0:
            raise ValueError(f"dataset size must be >= 0, got {self.dataset_size}")
        if num_replicas is None or rank is None:
            from ..group.world import get_rank, get_world_size, is_initialized
            if not is_initialized():
                raise RuntimeError("DistributedSampler needs num_replicas and rank, or an initialized "
                                   "process group (call init_process_group first)")
            num_replicas = get_world_size() if num_replicas is None else num_replicas
            rank = get_rank() if rank is None else rank
        if num_replicas < 1:
            raise ValueError(f"num_replicas must be >= 1, got {num_replicas}")
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank must be in [0, {num_replicas - 1}], got {rank}")
        self.num_replicas, self.rank = int(num_replicas), int(rank)
        self.shuffle, self.seed, self.drop_last = shuffle, int(seed), drop_last
        self.epoch = 0
        n, p = self.dataset_size, self.num_replicas
        if drop_last and n % p != 0:
            self.num_samples = math.ceil((n - p) / p)
        else:
            self.num_samples = math.ceil(n / p)
        self.total_size = self.num_samples * p

    def set_epoch(self, epoch: int) -> None:
        """Choose the shuffle of the coming epoch (call it before iterating each epoch)."""
        self.epoch = int(epoch)

    def indices(self) -> np.ndarray:
        """This rank's indices for the current epoch, as an int64 array."""
        n = self.dataset_size
        if self.shuffle:
            order = np.random.default_rng(self.seed + self.epoch).permutation(n)
        else:
            order = np.arange(n, dtype=np.int64)
        if not self.drop_last and self.total_size > n and n > 0:
            order = np.resize(order, self.total_size)  # np.resize repeats from the start
        order = order[: self.total_size]
        return order[self.rank:self.total_size:self.num_replicas].astype(np.int64, copy=False)

    def __iter__(self) -> Iterator[int]:
        return iter(self.indices().tolist())

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> Dict[str, int]:
        return {"epoch": self.epoch, "seed": self.seed, "num_replicas": self.num_replicas,
                "dataset_size": self.dataset_size}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if int(state["dataset_size"]) != self.dataset_size:
            raise ValueError(f"sampler state is for a dataset of {state['dataset_size']} items, "
                             f"this sampler has {self.dataset_size}")
        self.epoch, self.seed = int(state["epoch"]), int(state["seed"])

    def __repr__(self) -> str:
        return (f"DistributedSampler(size={self.dataset_size}, rank={self.rank}/"
                f"{self.num_replicas}, shuffle={self.shuffle}, seed={self.seed}, "
                f"epoch={self.epoch}, drop_last={self.drop_last})")
