"""Training loops the Ray tests run on their workers, and the same runs under our launcher.

``digits``: the digits MLP trained by the project's ``Trainer`` (it joins the job from the
environment); run as a script under the launcher, rank 0 writes the same losses to a file.
``stepped``: a loop of single steps, with a checkpoint every ``interval`` steps, that logs
every step it completes, so that a test can count the steps a killed worker lost.
"""
from __future__ import annotations

import json
import os
import sys
import tempfile
import time

import numpy as np

TRAIN_ROWS, VAL_ROWS, GLOBAL_BATCH = 256, 64, 32


def digits(config: dict) -> dict:
    """Two epochs of the digits MLP with the Trainer; the epochs' losses."""
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader, TensorDataset, load_digits
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer, TrainingConfig
    world = int(os.environ.get("WORLD_SIZE", "1"))
    train_set, val_set = load_digits(seed=0)
    train_set = TensorDataset(*(a[:TRAIN_ROWS] for a in train_set.arrays))
    val_set = TensorDataset(*(a[:VAL_ROWS] for a in val_set.arrays))
    manual_seed(0)
    model = MLP([64, 32, 10])
    settings = TrainingConfig(epochs=config.get("epochs", 2), seed=3, verbose=False,
                              progress_bar=False)
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1, momentum=0.9), F.cross_entropy,
                      settings, strategy="ddp")
    history = trainer.fit(DataLoader(train_set, batch_size=GLOBAL_BATCH // world, shuffle=True),
                          DataLoader(val_set, batch_size=16))
    epochs = history.state_dict()["epochs"]
    return {"train_loss": [e["train_loss"] for e in epochs],
            "val_loss": [e["val_loss"] for e in epochs]}


def digits_loop(config: dict) -> None:
    from neural_arch.ray import report
    report(digits(config))


def context_loop(config: dict) -> None:
    """Reports what get_context() and the environment say, twice (two reports)."""
    from neural_arch.ray import get_checkpoint, get_context, report
    import neural_arch.distributed as dist
    ctx = get_context()
    dist.init_process_group()
    total = np.array([float(ctx.get_world_rank() + 1)])
    dist.all_reduce(total)
    seen = {"rank": ctx.get_world_rank(), "size": ctx.get_world_size(),
            "local_rank": ctx.get_local_rank(), "node_rank": ctx.get_node_rank(),
            "local_world_size": ctx.get_local_world_size(), "backend": dist.get_backend(),
            "sum": float(total[0]), "env_rank": os.environ["RANK"],
            "checkpoint": get_checkpoint(), "config": config}
    dist.destroy_process_group()
    report({"first": 1})
    with open(os.path.join(config["out"], f"rank{ctx.get_world_rank()}.json"), "w") as f:
        json.dump({k: v for k, v in seen.items() if k != "checkpoint"} | {
            "checkpoint": None if seen["checkpoint"] is None else seen["checkpoint"].path}, f)
    report(seen | {"checkpoint": None})


def raising_loop(config: dict) -> None:
    from neural_arch.ray import get_context
    if get_context().get_world_rank() == config["rank"]:
        raise ValueError(f"bad batch at step {config['step']}")


# ----- stepped: a checkpoint every `interval` steps --------------------------------------
def _batch(step: int, rank: int, world: int, rows: int):
    from neural_arch.data import load_digits
    train_set, _ = load_digits(seed=0)
    features, labels = (np.asarray(a) for a in train_set.arrays)
    start = (step * GLOBAL_BATCH) % (len(labels) - GLOBAL_BATCH)
    part = slice(start + rank * rows, start + (rank + 1) * rows)
    return features[part], labels[part]


def train_steps(first, total, rank, world, state=None, after_step=None):
    """Steps ``first`` .. ``total - 1`` of SGD with momentum on the digits MLP, gradients
    averaged over ``world`` ranks; the final loss of the whole batch, the model, the optimizer."""
    import neural_arch.functional as F
    import neural_arch.distributed as dist
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    manual_seed(0)
    model = MLP([64, 16, 10])
    optimizer = SGD(model.parameters(), lr=0.05, momentum=0.9)
    if state is not None:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    loss = None
    for step in range(first, total):
        features, labels = _batch(step, rank, world, GLOBAL_BATCH // world)
        loss = F.cross_entropy(model(Tensor(features)), Tensor(labels))
        optimizer.zero_grad()
        loss.backward()
        if world > 1:
            for p in model.parameters():
                grad = p.grad.array
                dist.all_reduce(grad)
                grad /= world
        optimizer.step()
        if after_step is not None:
            after_step(step, model, optimizer)
    return model, optimizer


def stepped_loop(config: dict) -> None:
    import neural_arch as na
    import neural_arch.distributed as dist
    from neural_arch.ray import Checkpoint, get_checkpoint, get_context, report
    ctx = get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    dist.init_process_group()
    state, first = None, 0
    checkpoint = get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            state = na.load(os.path.join(folder, "state.nf"))
        first = int(state.pop("step")) + 1
    log = os.path.join(config["out"], f"steps.rank{rank}")
    with open(os.path.join(config["out"], f"pid.rank{rank}"), "a") as f:
        f.write(f"{os.getpid()} {first}\n")

    def after_step(step, model, optimizer):
        with open(log, "a") as f:
            f.write(f"{os.getpid()} {step}\n")
        time.sleep(config.get("step_sleep", 0.0))
        if (step + 1) % config["interval"] == 0:
            with tempfile.TemporaryDirectory() as folder:
                if rank == 0:
                    na.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                             "step": step}, os.path.join(folder, "state.nf"))
                report({"step": step}, checkpoint=Checkpoint.from_directory(folder)
                       if rank == 0 else None)
        if config.get("raise_at") == step:
            raise RuntimeError(f"rank {rank} fails at step {step}")

    model, _ = train_steps(first, config["total"], rank, world, state, after_step)
    weights = {k: np.asarray(getattr(v, "array", v)).tolist() for k, v in
               model.state_dict().items()}
    dist.destroy_process_group()
    report({"step": config["total"] - 1, "weights": weights})


if __name__ == "__main__":  # under our launcher: python -m ...launcher ... ray_jobs.py -- OUT
    losses = digits({})
    import neural_arch.distributed as dist  # noqa: F401 - the Trainer ended its group
    if os.environ.get("RANK", "0") == "0":
        with open(sys.argv[1], "w") as f:
            json.dump(losses, f)
