"""``neural_arch.utils.data``: torch's ``torch.utils.data`` path to ``neural_arch.data``.

The classes are ``neural_arch.data``'s own. ``DistributedSampler`` (also reachable here, as in
torch) is imported on first use, because it brings in ``neural_arch.distributed``, which a
single-process script never needs.
"""
from __future__ import annotations

from ..._lazy import lazy_names
from ...data import (DataLoader, Dataset, Subset, TensorDataset, default_collate,
                     random_split)
from ...data import WorkerInfo, get_worker_info


__getattr__, __dir__ = lazy_names(__name__, {"DistributedSampler": ".distributed"})

__all__ = ["DataLoader", "Dataset", "Subset", "TensorDataset", "default_collate",
           "random_split", "DistributedSampler"]
__all__ += ["get_worker_info", "WorkerInfo"]
