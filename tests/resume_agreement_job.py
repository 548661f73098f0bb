"""A Trainer laid out as tensor-parallel training lays out its checkpoints, for the resume tests
and the fault report: the world is a (dp, columns) grid, each column saves into a directory of
its own over its data-parallel group (as each tensor-parallel rank saves its shards), and the
whole world must resume from one step. The model is replicated, so every column trains the
same weights and any column's checkpoint of a step equals another's.

``train_columns`` is a rank function for ``dist_harness.run_ranks``; ``damage`` flips one byte
of a checkpoint file, the way a failing disk or a bad copy would.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict

import numpy as np

CHECKPOINT_LOGGER = "neural_arch.distributed.checkpoint"
SAVE_INTERVAL = 2
BAD_FILE = "model.safetensors"


def column_dir(root: str, column: int) -> str:
    return os.path.join(str(root), "checkpoints", f"tp{column}")


def step_dir(root: str, column: int, step: int) -> str:
    from neural_arch.distributed.checkpoint import format as fmt
    return os.path.join(column_dir(root, column), fmt.checkpoint_name(0, step))


def damage(path: str, file_name: str = BAD_FILE) -> str:
    """Flip a byte in the middle of ``path/file_name`` (size unchanged); returns its path."""
    target = os.path.join(path, file_name)
    with open(target, "r+b") as handle:
        data = bytearray(handle.read())
        data[len(data) // 2] ^= 0xFF
        handle.seek(0)
        handle.write(data)
    return target


def _dataset():
    from neural_arch.data import TensorDataset
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return TensorDataset(x, y)


def train_columns(rank: int, world_size: int, root: str, columns: int, max_steps: int,
                  resume: bool, agree: bool = True,
                  expect_error: bool = False) -> Dict[str, Any]:
    """Train to ``max_steps`` (resuming when asked) and report the step this rank started
    from, the steps it ended at, its final weights and the checkpoint warnings it logged.
    ``agree=False`` leaves the choice of step to each column's data-parallel group;
    ``expect_error=True`` reports the error ``fit`` raised (its type and message) instead."""
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader
    from neural_arch.distributed import init_device_mesh
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Callback, Trainer, TrainingConfig

    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logging.getLogger(CHECKPOINT_LOGGER).addHandler(handler)
    mesh = init_device_mesh((world_size // columns, columns), mesh_dim_names=("dp", "tp"))
    column = mesh.get_local_rank("tp")
    started = []

    class StartStep(Callback):
        def on_fit_start(self, trainer: Any) -> None:
            started.append(trainer.step)

    manual_seed(0)
    model = MLP([6, 16, 2])
    config = TrainingConfig(max_steps=max_steps, save_interval=SAVE_INTERVAL, resume=resume,
                            checkpoint_dir=column_dir(root, column), seed=5, verbose=False,
                            progress_bar=False)
    extra = {"resume_group": resolve_group(None)} if agree else {}
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1, momentum=0.9), F.cross_entropy,
                      config, callbacks=[StartStep()], group=mesh.get_group("dp"), **extra)
    dp = trainer.world
    try:
        trainer.fit(DataLoader(_dataset(), batch_size=8 // dp, shuffle=True))
    except Exception as exc:
        if not expect_error:
            raise
        return {"column": column, "error": type(exc).__name__, "message": str(exc),
                "warnings": warnings}
    return {"column": column, "start": started[0], "steps": trainer.step,
            "weights": {n: p.array.copy() for n, p in model.named_parameters()},
            "warnings": warnings}
