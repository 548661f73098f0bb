"""``TensorParallel`` ("tensor_parallel"): a model already split over "tp" groups, trained
data-parallel over the "dp" group of the same device mesh.

The data is split over ``group`` (the dp group, which must be given); the step is DDP's over
it, optionally with ZeRO-1 (``zero_stage=1``), and the global norm adds each rank's share
over its tp group (``AdvancedDistributedDataParallel`` finds the tp layers in the model).
Checkpoints hold this rank's shards: give each tp rank a directory of its own and the whole
world as ``resume_group``, as ``train_gpt --tp`` does.
"""
from __future__ import annotations

from typing import Any

from .wrapped import WrappedStep


class TensorParallel(WrappedStep):
    name = "tensor_parallel"

    def _check(self, model: Any, config: Any, group: Any) -> None:
        if config.zero_stage not in (0, 1):
            raise ValueError(f"strategy 'tensor_parallel' supports zero_stage 0 or 1, got "
                             f"{config.zero_stage}: FSDP would shard the tensor-parallel "
                             f"shards again over dp")
        if group is None:
            raise ValueError("strategy 'tensor_parallel' needs group=<the mesh's dp group>: "
                             "the whole world would split the data between ranks that hold "
                             "different shards of the same replica")
        self.zero_stage = config.zero_stage
