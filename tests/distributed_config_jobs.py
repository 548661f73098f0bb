"""What the workers of tests/tracking/test_distributed_config_run.py build: a
``PyTorchDDPTrainer`` from a ``DistributedConfig`` (importable by name, as every recipe must be)."""
from __future__ import annotations

import numpy as np

from neural_arch.core import manual_seed
from neural_arch.data import TensorDataset
from neural_arch.models import MLP
from neural_arch.nn import Linear, Module
from neural_arch.training import DistributedConfig, PyTorchDDPTrainer


def data(rows: int = 32) -> TensorDataset:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 6)).astype(np.float32)
    return TensorDataset(x, (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64))


def make_trainer(**fields) -> PyTorchDDPTrainer:
    manual_seed(0)
    return PyTorchDDPTrainer(MLP([6, 8, 2]), config=DistributedConfig(**fields),
                             optimizer="sgd", verbose=False, progress_bar=False)


class HalfUsed(Module):
    """A model whose second layer never takes part in the loss."""

    def __init__(self):
        super().__init__()
        self.used, self.unused = Linear(6, 2), Linear(6, 2)

    def forward(self, x):
        return self.used(x)
