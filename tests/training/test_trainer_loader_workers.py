"""A DataLoader with worker processes keeps them when the Trainer (or PyTorchDDPTrainer)
rebuilds it around a DistributedSampler, and trains exactly as without workers."""
from __future__ import annotations

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.data import DataLoader, get_worker_info
from neural_arch.optim import SGD
from neural_arch.training import Trainer
from neural_arch.training.batches import shard_loader
from neural_arch.training.ddp_trainer import per_process_loader

import self_launch_job as job

pytestmark = pytest.mark.timeout(60)


class Rows:
    """The problem's rows; with ``workers_only`` an item made in the main process raises, so a
    loader that silently lost its workers cannot train."""

    def __init__(self, workers_only: bool):
        self.rows, self.workers_only = job.problem()[0], workers_only

    def __len__(self):
        return len(self.rows)

    def __getitem__(self, index):
        if self.workers_only and get_worker_info() is None:
            raise RuntimeError(f"item {index} was made in the main process, not in a worker")
        return self.rows[index]


def _fit(num_workers):
    model = job.small_model()
    options = {"num_workers": num_workers} if num_workers else {}
    loader = DataLoader(Rows(workers_only=bool(num_workers)), batch_size=8, shuffle=True,
                        **options)
    history = Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                      job.quiet_config(epochs=2)).fit(loader)
    return history, model.state_dict()


def test_the_trainer_keeps_the_loaders_workers_and_trains_alike():
    loader = DataLoader(Rows(False), batch_size=8, num_workers=2, prefetch_factor=3,
                        persistent_workers=True)
    sharded = shard_loader(loader, 1, 0, None, 5)
    assert (sharded.num_workers, sharded.prefetch_factor, sharded.persistent_workers) == \
        (2, 3, True)
    assert per_process_loader(loader, 4, "test").num_workers == 2
    with_workers, weights = _fit(2)
    without, reference = _fit(0)
    np.testing.assert_allclose(with_workers["train_loss"], without["train_loss"], rtol=1e-6)
    for name, value in reference.items():
        np.testing.assert_allclose(weights[name], value, rtol=1e-6, err_msg=name)
