"""2-D pooling layers: ``MaxPool2d``, ``AvgPool2d``, ``AdaptiveAvgPool2d`` (torch's)."""
from __future__ import annotations

from typing import Any, Optional

from ..core.ops_pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from ._dtype import as_tensor
from .module import Module


class MaxPool2d(Module):
    """Window maxima; ``stride`` defaults to ``kernel_size``. With ``return_indices`` the
    call returns (output, flat input indices of the maxima), as torch."""

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0,
                 dilation: Any = 1, return_indices: bool = False,
                 ceil_mode: bool = False) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding, self.dilation = padding, dilation
        self.return_indices, self.ceil_mode = return_indices, ceil_mode

    def forward(self, x: Any) -> Any:
        return max_pool2d(as_tensor(x), self.kernel_size, self.stride, self.padding,
                          self.dilation, self.ceil_mode, self.return_indices)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, " \
               f"dilation={self.dilation}, ceil_mode={self.ceil_mode}"


class AvgPool2d(Module):
    """Window means; the divisor counts padding unless ``count_include_pad=False``."""

    def __init__(self, kernel_size: Any, stride: Optional[Any] = None, padding: Any = 0,
                 ceil_mode: bool = False, count_include_pad: bool = True,
                 divisor_override: Optional[int] = None) -> None:
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = kernel_size if stride is None else stride
        self.padding, self.ceil_mode = padding, ceil_mode
        self.count_include_pad, self.divisor_override = count_include_pad, divisor_override

    def forward(self, x: Any) -> Any:
        return avg_pool2d(as_tensor(x), self.kernel_size, self.stride, self.padding,
                          self.ceil_mode, self.count_include_pad, self.divisor_override)

    def extra_repr(self) -> str:
        return f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}"


class AdaptiveAvgPool2d(Module):
    """Means over windows chosen to give ``output_size`` (an int, or a pair whose None
    entries keep the input's size)."""

    def __init__(self, output_size: Any) -> None:
        super().__init__()
        self.output_size = output_size

    def forward(self, x: Any) -> Any:
        return adaptive_avg_pool2d(as_tensor(x), self.output_size)

    def extra_repr(self) -> str:
        return f"output_size={self.output_size}"
