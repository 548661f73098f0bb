"""The TabGPT guide's hand-written path: ``DistributedManager`` (joining the job),
``GradientSynchronization`` (averaging a model's gradients by hand), ``DataSharding`` (a
``DistributedSampler``), and ``barrier`` / ``is_main_process``.

These are for a loop the script writes itself; ``DistributedTrainer`` needs none of them.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...distributed import (DistributedSampler, ReduceOp, all_reduce, destroy_process_group,
                            get_rank, get_world_size, init_process_group, is_initialized)
from ...distributed import barrier as _barrier
from .configs import DistributedConfig
from .mapping import _BACKENDS

__all__ = ["DataSharding", "DistributedManager", "GradientSynchronization", "barrier",
           "get_rank", "get_world_size", "is_main_process"]


def is_main_process() -> bool:
    """Rank 0 of the job (True in a process without one)."""
    return not is_initialized() or get_rank() == 0


def barrier() -> None:
    """Wait for every rank (returns at once without a job)."""
    if is_initialized():
        _barrier()


def _config(config: Any, who: str) -> DistributedConfig:
    if not isinstance(config, DistributedConfig):
        raise TypeError(f"{who} needs a DistributedConfig, got {type(config).__name__}")
    return config


class DistributedManager:
    """``initialize()`` joins the job (``init_process_group`` with the config's backend, unless
    the script made the group) and checks the config's world size and rank against it."""

    def __init__(self, config: DistributedConfig) -> None:
        self.config = _config(config, "DistributedManager")
        self._owns_group = False

    def initialize(self) -> "DistributedManager":
        backend = _BACKENDS.get(str(self.config.backend).lower())
        if backend is None:
            raise ValueError(f"DistributedConfig.backend={self.config.backend!r}: choose one "
                             f"of {sorted(_BACKENDS)}")
        if not is_initialized():
            init_process_group(backend)
            self._owns_group = True
        for name, ours in (("world_size", get_world_size()), ("rank", get_rank())):
            value = getattr(self.config, name)
            if value is not None and value != ours:
                raise ValueError(f"DistributedConfig.{name}={value!r}: the job's {name} is "
                                 f"{ours}")
        return self

    @property
    def rank(self) -> int:
        return get_rank()

    @property
    def world_size(self) -> int:
        return get_world_size()

    def is_main_process(self) -> bool:
        return is_main_process()

    def barrier(self) -> None:
        barrier()

    def cleanup(self) -> None:
        """Ends the group ``initialize`` made (a group the script made stays)."""
        if self._owns_group and is_initialized():
            destroy_process_group()
        self._owns_group = False


class GradientSynchronization:
    """``synchronize_gradients(model, manager)``: every parameter's gradient replaced by its
    mean over the ranks, in flat buffers of at most ``bucket_size_mb`` per dtype."""

    def __init__(self, config: DistributedConfig) -> None:
        self.config = _config(config, "GradientSynchronization")
        if self.config.use_gradient_compression:
            raise ValueError("DistributedConfig.use_gradient_compression=True: compression "
                             "runs as DDP's communication hook, in DistributedTrainer; by "
                             "hand the gradients are averaged exactly")
        self.bucket_bytes = int(float(self.config.bucket_size_mb) * 2 ** 20)
        if self.bucket_bytes < 1:
            raise ValueError(f"DistributedConfig.bucket_size_mb={self.config.bucket_size_mb!r} "
                             f"must be > 0")

    def synchronize_gradients(self, model: Any, manager: Optional[Any] = None) -> None:
        if not is_initialized():
            raise RuntimeError("synchronize_gradients: no process group; call "
                               "DistributedManager(config).initialize() first")
        world = get_world_size()
        grads = [p for p in model.parameters() if p.requires_grad and p.grad is not None]
        by_dtype: dict = {}
        for p in grads:
            by_dtype.setdefault(np.dtype(p.grad.array.dtype), []).append(p)
        # the same order on every rank: parameters in the model's order, dtypes by name
        for dtype in sorted(by_dtype, key=str):
            bucket: list = []
            size = 0
            for p in by_dtype[dtype] + [None]:
                fits = p is not None and size + p.grad.array.nbytes <= self.bucket_bytes
                if p is not None and (not bucket or fits):
                    bucket.append(p)
                    size += p.grad.array.nbytes
                    continue
                self._average(bucket, dtype, world)
                bucket, size = ([p], p.grad.array.nbytes) if p is not None else ([], 0)

    @staticmethod
    def _average(bucket: list, dtype: np.dtype, world: int) -> None:
        if not bucket:
            return
        flat = np.concatenate([np.asarray(p.grad.array, dtype=dtype).reshape(-1) for p in bucket])
        all_reduce(flat, ReduceOp.SUM)
        flat /= world
        offset = 0
        for p in bucket:
            n = p.grad.array.size
            p.grad = flat[offset:offset + n].reshape(p.grad.array.shape).copy()
            offset += n


class DataSharding:
    """``create_distributed_sampler(dataset, shuffle, drop_last)``: this rank's share."""

    def __init__(self, config: DistributedConfig) -> None:
        self.config = _config(config, "DataSharding")

    def create_distributed_sampler(self, dataset: Any, shuffle: bool = True,
                                   drop_last: bool = False, seed: int = 0) -> DistributedSampler:
        return DistributedSampler(dataset, shuffle=shuffle, drop_last=drop_last, seed=seed)
