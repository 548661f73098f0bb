"""One Trainer run on a fixed classification problem, for the tests to start in one or several
processes: ``python trainer_job.py OUT.json GLOBAL_BATCH``. The global batch is split over the
ranks, so every world size sees the same batches; rank 0 writes the history and a digest of the
final weights."""
import json
import os
import sys

import numpy as np

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader, TensorDataset
from neural_arch.distributed import init_process_group
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.training import Trainer, TrainingConfig


def problem(seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(96, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return TensorDataset(x[:64], y[:64]), TensorDataset(x[64:], y[64:])


def main() -> None:
    out, global_batch = sys.argv[1], int(sys.argv[2])
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # under the launcher; alone, the Trainer makes its own one-process group
        init_process_group("auto")
    manual_seed(0)
    model = MLP([6, 16, 2])
    train, val = problem()
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1, momentum=0.9), F.cross_entropy,
                      TrainingConfig(epochs=3, log_interval=2, seed=5, verbose=False))
    history = trainer.fit(DataLoader(train, batch_size=global_batch // world, shuffle=True),
                          DataLoader(val, batch_size=8))
    if int(os.environ.get("RANK", "0")) == 0:
        weights = {n: p.array.tolist() for n, p in model.named_parameters()}
        with open(out, "w") as handle:
            json.dump({"history": history.state_dict(), "weights": weights}, handle)


if __name__ == "__main__":
    main()
