"""``neural_arch.utils.data``: torch's ``torch.utils.data`` path to ``neural_arch.data``.

The classes are ``neural_arch.data``'s own. ``DistributedSampler`` (also reachable here, as in
torch) is imported on first use, because it brings in ``neural_arch.distributed``, which a
single-process script never needs.
"""
from __future__ import annotations

from typing import Any

from ...data import (DataLoader, Dataset, Subset, TensorDataset, default_collate,
                     random_split)


def __getattr__(name: str) -> Any:
    if name == "DistributedSampler":
        from .distributed import DistributedSampler
        return DistributedSampler
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DataLoader", "Dataset", "Subset", "TensorDataset", "default_collate",
           "random_split", "DistributedSampler"]
