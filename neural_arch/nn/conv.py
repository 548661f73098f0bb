"""Convolution layers ``Conv1d`` and ``Conv2d`` with torch's arguments and initialisation."""
from __future__ import annotations

from typing import Any, Sequence, Tuple, Union

from ..core.ops_conv import PADDING_STRINGS, convolution, expand_param
from . import init
from ._dtype import as_tensor
from .affine_parameters import add_affine_parameters
from .module import Module

_TORCH_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    """Weight (out_channels, in_channels / groups, *kernel_size), optional bias (out_channels).

    Initialised as torch: weight ``kaiming_uniform_(a=sqrt(5))`` and bias U(-b, b) with
    ``b = 1 / sqrt(fan_in)``, fan_in = in_channels / groups * prod(kernel_size).
    """

    spatial = 0  # set by the subclasses

    def __init__(self, in_channels: int, out_channels: int,
                 kernel_size: Union[int, Sequence[int]], stride: Any = 1, padding: Any = 0,
                 dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        name = type(self).__name__
        if not isinstance(groups, int) or groups < 1:
            raise ValueError(f"{name}: groups must be a positive int, got {groups!r}")
        if in_channels % groups or out_channels % groups:
            raise ValueError(f"{name}: in_channels={in_channels} and out_channels="
                             f"{out_channels} must both be divisible by groups={groups}")
        if padding_mode not in _TORCH_PADDING_MODES:
            raise ValueError(f"{name}: padding_mode must be one of {_TORCH_PADDING_MODES}, got "
                             f"{padding_mode!r}")
        if padding_mode != "zeros":
            raise ValueError(f"{name}: only padding_mode='zeros' is implemented, got "
                             f"{padding_mode!r}")
        dims = self.spatial
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.kernel_size = expand_param(kernel_size, dims, "kernel_size", name, 1)
        self.stride = expand_param(stride, dims, "stride", name, 1)
        self.dilation = expand_param(dilation, dims, "dilation", name, 1)
        if isinstance(padding, str):
            if padding not in PADDING_STRINGS:
                raise ValueError(f"{name}: padding must be an int, a tuple or one of "
                                 f"{PADDING_STRINGS}, got {padding!r}")
            if padding == "same" and any(s != 1 for s in self.stride):
                raise ValueError(f"{name}: padding='same' is not supported for strided "
                                 f"convolutions (stride={self.stride})")
            self.padding: Union[str, Tuple[int, ...]] = padding
        else:
            self.padding = expand_param(padding, dims, "padding", name, 0)
        self.groups, self.padding_mode = groups, padding_mode
        shape = (self.out_channels, self.in_channels // groups) + self.kernel_size
        add_affine_parameters(self, shape, bias, device, dtype)

    def reset_parameters(self) -> None:
        init.affine_default_(self.weight, self.bias)

    def forward(self, x: Any) -> Any:
        return convolution(as_tensor(x), self.weight, self.bias, self.stride, self.padding,
                           self.dilation, self.groups, self.spatial, type(self).__name__)

    def extra_repr(self) -> str:
        text = f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
               f"stride={self.stride}"
        if self.padding != (0,) * self.spatial:
            text += f", padding={self.padding!r}"
        if self.dilation != (1,) * self.spatial:
            text += f", dilation={self.dilation}"
        if self.groups != 1:
            text += f", groups={self.groups}"
        if self.bias is None:
            text += ", bias=False"
        return text


class Conv1d(_ConvNd):
    """1-D convolution over (N, C, L) or unbatched (C, L) inputs (torch's ``nn.Conv1d``)."""

    spatial = 1


class Conv2d(_ConvNd):
    """2-D convolution over (N, C, H, W) or unbatched (C, H, W) inputs (``nn.Conv2d``)."""

    spatial = 2

