"""A small residual network for 32x32 images (the CIFAR ResNets of He et al., 2016).

``ResNet(block_counts, widths, num_classes)``: a 3x3 stem convolution, one stage of
``BasicBlock``s per entry of ``block_counts`` (the first block of every stage after the first
halves the resolution), global average pooling and a linear classifier. A block whose input
and output shapes differ takes a 1x1 convolution + BatchNorm shortcut (torchvision's
``downsample``). ``resnet8`` / ``resnet20`` are the 6n+2-layer nets with widths 16, 32, 64.

Parameter names follow torchvision's ResNet (``conv1``, ``bn1``, ``layer1.0.conv1``,
``layer1.0.downsample.0``, ``fc``), so state dicts map one to one. Layers keep torch's default
initialisation.
"""
from __future__ import annotations

from typing import Any, Sequence

from .. import functional as F
from ..nn import (AdaptiveAvgPool2d, BatchNorm2d, Conv2d, Linear, Module, Sequential)
from ..nn._dtype import as_tensor


class BasicBlock(Module):
    """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)) with 3x3 convolutions."""

    def __init__(self, in_channels: int, channels: int, stride: int = 1,
                 dtype: Any = None) -> None:
        super().__init__()
        self.conv1 = Conv2d(in_channels, channels, 3, stride=stride, padding=1, bias=False,
                            dtype=dtype)
        self.bn1 = BatchNorm2d(channels, dtype=dtype)
        self.conv2 = Conv2d(channels, channels, 3, padding=1, bias=False, dtype=dtype)
        self.bn2 = BatchNorm2d(channels, dtype=dtype)
        if stride != 1 or in_channels != channels:
            self.downsample = Sequential(
                Conv2d(in_channels, channels, 1, stride=stride, bias=False, dtype=dtype),
                BatchNorm2d(channels, dtype=dtype))
        else:
            self.downsample = None

    def forward(self, x: Any) -> Any:
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return F.relu(out + shortcut)


class ResNet(Module):
    """A CIFAR-style ResNet; input (N, in_channels, H, W), output (N, num_classes) logits."""

    def __init__(self, block_counts: Sequence[int] = (1, 1, 1),
                 widths: Sequence[int] = (16, 32, 64), num_classes: int = 10,
                 in_channels: int = 3, dtype: Any = None) -> None:
        super().__init__()
        block_counts, widths = [int(n) for n in block_counts], [int(w) for w in widths]
        if not block_counts or len(block_counts) != len(widths) or \
                min(block_counts) < 1 or min(widths) < 1:
            raise ValueError(f"ResNet needs one positive block count per positive width, got "
                             f"block_counts={block_counts}, widths={widths}")
        if num_classes < 1 or in_channels < 1:
            raise ValueError(f"ResNet: num_classes={num_classes} and in_channels="
                             f"{in_channels} must be positive")
        self.block_counts, self.widths = block_counts, widths
        self.conv1 = Conv2d(in_channels, widths[0], 3, padding=1, bias=False, dtype=dtype)
        self.bn1 = BatchNorm2d(widths[0], dtype=dtype)
        channels = widths[0]
        for stage, (count, width) in enumerate(zip(block_counts, widths)):
            blocks = []
            for i in range(count):
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(BasicBlock(channels, width, stride, dtype=dtype))
                channels = width
            setattr(self, f"layer{stage + 1}", Sequential(*blocks))
        self.avgpool = AdaptiveAvgPool2d(1)
        self.fc = Linear(channels, num_classes, dtype=dtype)

    def forward(self, x: Any) -> Any:
        out = F.relu(self.bn1(self.conv1(as_tensor(x))))
        for stage in range(len(self.block_counts)):
            out = getattr(self, f"layer{stage + 1}")(out)
        return self.fc(self.avgpool(out).flatten(1))


def resnet8(num_classes: int = 10, **kwargs: Any) -> ResNet:
    """8 layers: one BasicBlock per stage, widths 16, 32, 64."""
    return ResNet((1, 1, 1), (16, 32, 64), num_classes, **kwargs)


def resnet20(num_classes: int = 10, **kwargs: Any) -> ResNet:
    """20 layers: three BasicBlocks per stage, widths 16, 32, 64."""
    return ResNet((3, 3, 3), (16, 32, 64), num_classes, **kwargs)
