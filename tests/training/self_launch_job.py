"""Pieces the self-launch tests hand to worker processes: they must be importable there, so
they live in a module, not in the test file's functions."""
import os
import signal
import time

import numpy as np

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader, TensorDataset
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.training import Trainer, TrainingConfig


def problem(seed: int = 0):
    """A small separable classification problem: (train, validation) data sets."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(48, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:])


def small_model():
    manual_seed(0)
    return MLP([6, 8, 2])


def quiet_config(**changes):
    return TrainingConfig(**{"epochs": 1, "seed": 5, "verbose": False, "progress_bar": False,
                             **changes})


def make_trainer(loss_fn=F.cross_entropy):
    model = small_model()
    return Trainer(model, SGD(model.parameters(), lr=0.1), loss_fn, quiet_config())


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def make_trainer_failing_on_rank_1():
    if rank() == 1:
        raise ValueError("no data shard for rank 1")
    return make_trainer()


class DyingLoss:
    """cross entropy, except that rank 1 dies (``how``) on its first step, once the job's
    group is up: the signal kills it mid-training, as a crash or the OOM killer would."""

    def __init__(self, how: str) -> None:
        self.how = how

    def __call__(self, output, target):
        if rank() == 1:
            if self.how == "sigkill":
                os.kill(os.getpid(), signal.SIGKILL)
            os._exit(3)
        return F.cross_entropy(output, target)


def make_dying_trainer(how: str):
    return make_trainer(DyingLoss(how))


def make_sleeping_trainer(marker_dir: str):
    """Writes ``started_<rank>`` and sleeps: the job a test interrupts."""
    open(os.path.join(marker_dir, f"started_{rank()}"), "w").close()
    time.sleep(60)
    return make_trainer()


def loader(batch_size: int, data=None, shuffle: bool = True):
    return DataLoader(problem()[0] if data is None else data, batch_size=batch_size,
                      shuffle=shuffle)
