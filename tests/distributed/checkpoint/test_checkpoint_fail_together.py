"""When one rank's part of a collective save or load fails, every rank raises: the failing rank
its own error, the others a ``DistributedError`` saying what did not happen (a save names rank
0, the one that writes)."""
from __future__ import annotations

import os
import shutil

import pytest

from dist_harness import run_ranks
from neural_arch import nn
from neural_arch.distributed.checkpoint import DistributedCheckpointManager

from checkpoint_training_job import TrainingJob

pytestmark = pytest.mark.timeout(60)


def _outcome(call):
    try:
        call()
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def _fail_on_one_rank(rank, world_size, directory):
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True)
    manager = DistributedCheckpointManager(directory)
    manager.save_checkpoint(job.model, job.optimizer, 0, 0, 1.0)
    # rank 1 loads into a model of other shapes: its load fails, rank 0's would succeed
    model = job.model if rank == 0 else nn.Sequential(nn.Linear(2, 2))
    loaded = _outcome(lambda: manager.load_checkpoint(model, restore_rng=False))
    # rank 0's directory turns into a file: its write fails, rank 1 only waits for it
    writer = DistributedCheckpointManager(os.path.join(directory, f"rank{rank}"))
    if rank == 0:
        shutil.rmtree(writer.checkpoint_dir, ignore_errors=True)
        open(writer.checkpoint_dir, "w").close()
    saved = _outcome(lambda: writer.save_checkpoint(job.model, job.optimizer, 0, 1, 1.0))
    return loaded, saved


def test_a_failure_on_one_rank_fails_every_rank(tmp_path):
    (load_0, save_0), (load_1, save_1) = run_ranks(_fail_on_one_rank, 2, "shm",
                                                   args=(str(tmp_path),))
    assert load_1 is not None and load_1[0] != "DistributedError", load_1
    assert load_0[0] == "DistributedError", load_0
    assert "[rank 0, load_checkpoint]" in load_0[1]
    assert "another rank failed to load its checkpoint" in load_0[1]
    assert save_0 is not None and save_0[0] != "DistributedError", save_0
    assert save_1[0] == "DistributedError", save_1
    assert "[rank 1, save_checkpoint, peer rank 0]" in save_1[1]
    assert "ckpt-e000000-s00000001 was not written" in save_1[1]
