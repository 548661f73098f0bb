"""A Trainer script as a newcomer writes it, without ``init_process_group``: under a launcher
the Trainer must join the job itself. ``python trainer_joins_job.py OUT_DIR GLOBAL_BATCH``:
each rank trains on GLOBAL_BATCH / WORLD_SIZE samples a step and writes ``rank<r>.json`` with
the world it trained on and its final weights; rank 0 also writes ``metrics.jsonl``."""
import json
import os
import sys

from trainer_job import problem

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.training import Trainer, TrainingConfig


def train(out_dir: str, batch: int):
    """(the world the Trainer trained on, its final weights as lists) after 4 steps."""
    manual_seed(0)
    model = MLP([6, 8, 2])
    train_set, _ = problem()
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1, momentum=0.9), F.cross_entropy,
                      TrainingConfig(epochs=1, max_steps=4, seed=5, log_interval=2,
                                     metrics_dir=out_dir, progress_bar=False))
    trainer.fit(DataLoader(train_set, batch_size=batch, shuffle=True))
    return trainer.world, {n: p.array.tolist() for n, p in model.named_parameters()}


def main() -> None:
    out_dir, global_batch = sys.argv[1], int(sys.argv[2])
    world_named = int(os.environ.get("WORLD_SIZE", "1"))
    world, weights = train(out_dir, global_batch // world_named)
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as handle:
        json.dump({"world": world, "weights": weights}, handle)


if __name__ == "__main__":
    main()
