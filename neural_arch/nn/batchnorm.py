"""``BatchNorm1d`` and ``BatchNorm2d``: normalise each channel over the batch (and space).

Training uses the batch's statistics and updates the running ones (``momentum``, or a
cumulative average when ``momentum`` is None); evaluation uses the running ones, unless
``track_running_stats=False``, in which case the batch's are used in both modes, as torch.

A synchronised subclass overrides two methods: ``_batch_statistics`` (mean, biased variance
and count over the whole group) and ``_reduce_gradient_sums`` (the input gradient's two
per-channel sums over the group); nothing else here is local-only.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ..core import Tensor
from ..core.ops_batchnorm import (batch_norm_fixed, batch_norm_training, local_statistics,
                                  update_running)
from ._dtype import as_tensor, parameter_dtype
from .module import Module
from .parameter import Parameter


class _BatchNorm(Module):
    """Shared by the BatchNorm layers; subclasses name the input ranks they accept."""

    input_ranks: Tuple[int, ...] = ()

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1,
                 affine: bool = True, track_running_stats: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if not isinstance(num_features, int) or num_features <= 0:
            raise ValueError(f"{type(self).__name__}: num_features must be a positive int, got "
                             f"{num_features!r}")
        self.num_features, self.eps, self.momentum = num_features, float(eps), momentum
        self.affine, self.track_running_stats = affine, track_running_stats
        dtype = parameter_dtype(dtype)
        if affine:
            self.weight = Parameter(np.ones(num_features, dtype=dtype))
            self.bias = Parameter(np.zeros(num_features, dtype=dtype))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if track_running_stats:
            self.register_buffer("running_mean", Tensor(np.zeros(num_features, dtype=dtype)))
            self.register_buffer("running_var", Tensor(np.ones(num_features, dtype=dtype)))
            self.register_buffer("num_batches_tracked", Tensor(np.array(0, dtype=np.int64)))
        else:
            for name in ("running_mean", "running_var", "num_batches_tracked"):
                self.register_buffer(name, None)
        if device is not None:
            self.to(device)

    def reset_running_stats(self) -> None:
        if self.track_running_stats:
            self.running_mean.array[...] = 0
            self.running_var.array[...] = 1
            self.num_batches_tracked.array[...] = 0

    def reset_parameters(self) -> None:
        self.reset_running_stats()
        if self.affine:
            self.weight.array[...] = 1
            self.bias.array[...] = 0

    # -- the seam for a synchronised variant ------------------------------------------------
    def _batch_statistics(self, data: Any, axes: Tuple[int, ...]) -> Tuple[Any, Any, int]:
        """Per-channel (mean, biased variance, element count) of the batch ``data``."""
        return local_statistics(data, axes)

    def _reduce_gradient_sums(self, sums: Any) -> Any:
        """The (2, C) per-channel sums the input gradient needs, over every contributor."""
        return sums

    # ---------------------------------------------------------------------------------------
    def forward(self, x: Any) -> Any:
        x = as_tensor(x)
        if x.array.ndim not in self.input_ranks:
            wanted = " or ".join(f"{r}D" for r in self.input_ranks)
            raise ValueError(f"{type(self).__name__}: expected {wanted} input, got shape "
                             f"{tuple(x.array.shape)}")
        if x.array.shape[1] != self.num_features:
            raise ValueError(f"{type(self).__name__}: input shape {tuple(x.array.shape)} has "
                             f"{x.array.shape[1]} channels, expected num_features="
                             f"{self.num_features}")
        use_batch = self.training or not self.track_running_stats
        if not use_batch:
            return batch_norm_fixed(x, self.running_mean, self.running_var, self.weight,
                                    self.bias, self.eps)
        # unless a subclass overrides them, the seams are the local defaults, which lets the
        # kernels compute the statistics and the gradient sums in their output's pass
        layer = type(self)
        local = layer._batch_statistics is _BatchNorm._batch_statistics
        local_sums = layer._reduce_gradient_sums is _BatchNorm._reduce_gradient_sums
        # a synchronised layer's backward does not check the running statistics (torch's
        # saves none either); a local one's does
        running = (self.running_mean, self.running_var) if local else ()
        out, mean, var, count = batch_norm_training(
            x, self.weight, self.bias, self.eps,
            local_statistics if local else self._batch_statistics,
            None if local_sums else self._reduce_gradient_sums, running)
        if self.training and self.track_running_stats:
            self.num_batches_tracked.array += 1
            momentum = self.momentum
            if momentum is None:  # cumulative moving average
                momentum = 1.0 / float(self.num_batches_tracked.array)
            update_running(self.running_mean, self.running_var, mean, var, count, momentum)
        return out

    def extra_repr(self) -> str:
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}, " \
               f"affine={self.affine}, track_running_stats={self.track_running_stats}"


class BatchNorm1d(_BatchNorm):
    """Over (N, C) or (N, C, L) inputs."""

    input_ranks = (2, 3)


class BatchNorm2d(_BatchNorm):
    """Over (N, C, H, W) inputs."""

    input_ranks = (4,)
