"""``SyncBatchNorm``: batch normalisation whose statistics span every rank of a process group.

In training each rank holds a slice of one global batch; the per-channel mean and variance are
those of the whole batch (each rank's count, mean and biased variance are all-gathered and
combined as in Chan's parallel algorithm, which stays accurate where a sum of squares would
cancel, and weighs uneven or empty slices by their counts), and the running statistics take the
global unbiased variance. The backward all-reduces the two per-channel sums the input gradient
needs, as torch's does; the weight and bias gradients stay local (DDP averages them). In
evaluation, or without a group of more than one rank, it is plain BatchNorm: no collective.

The layer plugs into ``nn.batchnorm._BatchNorm``'s two seams, so everything else (checks,
running-statistics update, the fused op) is the plain layer's own.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy as np

from ..backends import xp_of
from ..core.ops_batchnorm import local_statistics
from ..nn.batchnorm import _BatchNorm
from ..nn.module import Module
from .collectives import all_gather_into_tensor, all_reduce
from .group.world import get_world_size, is_initialized, resolve_group


class SyncBatchNorm(_BatchNorm):
    """torch's ``nn.SyncBatchNorm`` over (N, C, ...) inputs: 2D to 5D, as BatchNorm1d/2d/3d."""

    input_ranks = (2, 3, 4, 5)

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True,
                 process_group: Any = None, device: Any = None, dtype: Any = None) -> None:
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device,
                         dtype)
        self.process_group = process_group
        self._forward_group = None  # the group of the forward now running, None: local

    def _group_to_sync(self) -> Any:
        """The group to synchronise this forward over, or None (evaluation, no process group,
        or a group of one rank), as torch decides."""
        if not (self.training and is_initialized()):
            return None
        group = resolve_group(self.process_group)
        return group if get_world_size(group) > 1 else None

    def forward(self, x: Any) -> Any:
        self._forward_group = self._group_to_sync()
        try:
            return super().forward(x)
        finally:
            self._forward_group = None

    def _batch_statistics(self, data: Any, axes: Tuple[int, ...]) -> Tuple[Any, Any, int]:
        group = self._forward_group
        if group is None:
            return local_statistics(data, axes)
        return _global_statistics(data, axes, group)

    @property
    def _reduce_gradient_sums(self) -> Callable[[Any], Any]:
        # A property, not a method: the forward hands this callable to the graph node, and the
        # backward may run after a later forward (or a mode change); binding the group now
        # makes the backward reduce over exactly the ranks whose statistics the forward used.
        group = self._forward_group
        if group is None:
            return _unchanged
        return lambda sums: all_reduce(sums, group=group)

    def extra_repr(self) -> str:
        return super().extra_repr() + (
            "" if self.process_group is None else f", process_group={self.process_group!r}")

    @classmethod
    def convert_sync_batchnorm(cls, module: Module, process_group: Any = None) -> Module:
        """``module`` with every BatchNorm layer in its tree (itself included) replaced by a
        ``SyncBatchNorm`` holding the same parameters, buffers and training mode; returns the
        converted module (a new one when ``module`` itself is a BatchNorm layer)."""
        if not isinstance(module, Module):
            raise TypeError(f"convert_sync_batchnorm expects a Module, got "
                            f"{type(module).__name__}")
        if isinstance(module, _BatchNorm):
            return _converted(cls, module, process_group)
        for name, child in list(module.named_children()):
            setattr(module, name, cls.convert_sync_batchnorm(child, process_group))
        return module


def _unchanged(sums: Any) -> Any:
    return sums


def _converted(cls: type, bn: _BatchNorm, process_group: Any) -> SyncBatchNorm:
    sync = cls(bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats,
               process_group)
    # the same Parameter and buffer objects, as torch: optimizers built before still see them
    if bn.affine:
        sync.weight, sync.bias = bn.weight, bn.bias
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        setattr(sync, name, getattr(bn, name))
    sync.train(bn.training)
    for name, child in bn.named_children():  # torch keeps any submodules too
        sync.add_module(name, child)
    return sync


def _global_statistics(data: Any, axes: Tuple[int, ...], group: Any) -> Tuple[Any, Any, int]:
    """(mean, biased variance, count) of the batch whose slices all ranks of ``group`` hold."""
    xp = xp_of(data)
    channels = data.shape[1]
    count = data.size // channels if channels else 0
    mine = xp.zeros(2 * channels + 1, dtype=np.float64)
    mine[0] = count
    if count:  # an empty slice adds nothing: its mean and variance would be NaN
        mean, var, _ = local_statistics(data.astype(np.float64, copy=False), axes)
        mine[1:channels + 1], mine[channels + 1:] = mean, var
    size = get_world_size(group)
    every = xp.empty(size * mine.size, dtype=np.float64)
    all_gather_into_tensor(every, mine, group=group)
    every = every.reshape(size, mine.size)
    counts, means, variances = every[:, :1], every[:, 1:channels + 1], every[:, channels + 1:]
    total = float(counts.sum())
    if total == 0:
        raise ValueError(f"SyncBatchNorm: every rank's batch is empty (this rank's input shape "
                         f"{tuple(data.shape)}); expected more than 1 value per channel")
    mean = (counts * means).sum(axis=0) / total
    # Chan et al.: the within-slice squared deviations plus each slice's offset from the mean
    squares = (counts * variances).sum(axis=0) + (counts * (means - mean) ** 2).sum(axis=0)
    return (mean.astype(data.dtype), (squares / total).astype(data.dtype), int(round(total)))
