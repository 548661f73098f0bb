"""The torch twin of ``neural_arch.models.ResNet``: torchvision's BasicBlock CIFAR ResNet with
the same parameter names, so that our ``state_dict`` loads into it one to one.

Shared by ``conv_jobs`` (the benchmark) and ``tests/models/test_resnet.py``; it imports nothing
of neural_arch, and torch is passed in, so importing this module needs neither.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np


def torch_resnet(torch: Any, block_counts: Sequence[int] = (1, 1, 1),
                 widths: Sequence[int] = (16, 32, 64), num_classes: int = 10,
                 in_channels: int = 3) -> Any:
    """torch's ResNet with one stage of BasicBlocks per entry of ``block_counts`` (the first
    block of every stage after the first halves the resolution); defaults: resnet8."""
    tnn = torch.nn

    class Block(tnn.Module):
        def __init__(self, cin: int, cout: int, stride: int) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(cin, cout, 3, stride, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(cout)
            self.conv2 = tnn.Conv2d(cout, cout, 3, 1, 1, bias=False)
            self.bn2 = tnn.BatchNorm2d(cout)
            self.downsample = None
            if stride != 1 or cin != cout:
                self.downsample = tnn.Sequential(tnn.Conv2d(cin, cout, 1, stride, bias=False),
                                                 tnn.BatchNorm2d(cout))

        def forward(self, x: Any) -> Any:
            out = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
            return torch.relu(out + (x if self.downsample is None else self.downsample(x)))

    class Net(tnn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv1 = tnn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False)
            self.bn1 = tnn.BatchNorm2d(widths[0])
            cin = widths[0]
            for stage, (count, width) in enumerate(zip(block_counts, widths)):
                blocks = [Block(cin if i == 0 else width, width, 2 if stage and not i else 1)
                          for i in range(count)]
                setattr(self, f"layer{stage + 1}", tnn.Sequential(*blocks))
                cin = width
            self.avgpool = tnn.AdaptiveAvgPool2d(1)
            self.fc = tnn.Linear(cin, num_classes)

        def forward(self, x: Any) -> Any:
            out = torch.relu(self.bn1(self.conv1(x)))
            for stage in range(len(block_counts)):
                out = getattr(self, f"layer{stage + 1}")(out)
            return self.fc(torch.flatten(self.avgpool(out), 1))

    return Net()


def load_our_state(torch: Any, theirs: Any, state: Mapping[str, Any], what: str) -> None:
    """Copy ``state`` (our ``state_dict``: arrays or tensors) into the torch module ``theirs``,
    after checking that both name the same entries."""
    if sorted(state) != sorted(theirs.state_dict()):
        raise RuntimeError(f"{what}: the state dicts differ: ours {sorted(state)}, torch "
                           f"{sorted(theirs.state_dict())}")
    theirs.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})
