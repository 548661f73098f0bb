"""Sharded checkpoints of FullyShardedDataParallel through the checkpoint manager: saved at
world size 4 (each rank writes its own shards), resumed at 4, 2 and 1, training continues as
the uninterrupted run did; a damaged shard is named."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from dist_harness import RankFailed, run_ranks
from fsdp_cases import loss_of, make_model, make_optimizer, wrap_policy

pytestmark = pytest.mark.timeout(240)
STEPS, SAVED_AFTER, ROWS = 5, 2, 4  # 4 rows per step split over 4, 2 or 1 ranks


def _batch(step: int):
    rng = np.random.default_rng(500 + step)
    return rng.integers(0, 11, size=(ROWS, 8)), rng.integers(0, 11, size=(ROWS, 8))


def _job(rank, world_size, strategy):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(make_model("gpt", seed=10 + rank),
                                     sharding_strategy=strategy,
                                     auto_wrap_policy=wrap_policy("gpt"))
    return model, make_optimizer("adam", model.parameters())


def _step(model, optimizer, step, rank, world_size):
    x, y = _batch(step)
    per = ROWS // world_size
    optimizer.zero_grad()
    loss_of("gpt", model, x[rank * per:(rank + 1) * per], y[rank * per:(rank + 1) * per]
            ).backward()
    optimizer.step()


def _uninterrupted(rank, world_size, directory, strategy):
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    model, optimizer = _job(rank, world_size, strategy)
    manager = DistributedCheckpointManager(directory)
    for step in range(STEPS):
        _step(model, optimizer, step, rank, world_size)
        if step == SAVED_AFTER:
            manager.save_checkpoint(model, optimizer, epoch=0, step=step, loss=0.0)
    return model.full_state_dict()


def _resumed(rank, world_size, directory, strategy):
    from neural_arch.distributed.checkpoint import (DistributedCheckpointManager,
                                                    setup_fault_tolerant_training)
    model, optimizer = _job(rank, world_size, strategy)  # other weights until the load
    x, y = _batch(0)
    model(x[:1], y[:1])  # gathers the weights before the load: the load must make them stale
    state = setup_fault_tolerant_training(model, optimizer, DistributedCheckpointManager(directory))
    assert state["start_step"] == SAVED_AFTER + 1
    for step in range(state["start_step"], STEPS):
        _step(model, optimizer, step, rank, world_size)
    return model.full_state_dict()


def _check_equal(results, reference):
    for state in results:
        assert state.keys() == reference.keys()
        for key in reference:
            np.testing.assert_allclose(state[key], reference[key], rtol=1e-9, atol=1e-12,
                                       err_msg=key)


def _saved_at_four(directory, strategy):
    """The uninterrupted run at 4 ranks, saving into ``directory``: its final full state."""
    return run_ranks(_uninterrupted, 4, "shm", args=(str(directory), strategy))[0]


@pytest.fixture(scope="module")
def saved_full_shard(tmp_path_factory):
    """``_saved_at_four`` under FULL_SHARD, run once for the two tests that start from it:
    (its checkpoint folder, the final full state). Each test works on a copy of the folder."""
    directory = tmp_path_factory.mktemp("saved_full_shard")
    return directory, _saved_at_four(directory, "FULL_SHARD")


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_saved_at_four_resumes_at_four_two_and_one(tmp_path, strategy, request):
    if strategy == "FULL_SHARD":
        saved, reference = request.getfixturevalue("saved_full_shard")
        tmp_path = Path(shutil.copytree(saved, tmp_path / "saved"))
    else:
        reference = _saved_at_four(tmp_path, strategy)
    [path] = [os.path.join(tmp_path, d) for d in os.listdir(tmp_path)]
    assert {f"model.shard{r}.safetensors" for r in range(4)} <= set(os.listdir(path))
    for world_size, backend in ((4, "tcp"), (2, "shm"), (1, "shm")):
        results = run_ranks(_resumed, world_size, backend, args=(str(tmp_path), strategy))
        _check_equal(results, reference)


def test_resume_from_no_shard_into_full_shard(tmp_path):
    reference = run_ranks(_uninterrupted, 2, "shm", args=(str(tmp_path), "NO_SHARD"))[0]
    _check_equal(run_ranks(_resumed, 2, "shm", args=(str(tmp_path), "FULL_SHARD")), reference)


def test_a_wrong_resume_would_be_caught(tmp_path):
    """The comparison above can fail: without the load, training ends elsewhere."""
    reference = run_ranks(_uninterrupted, 2, "shm", args=(str(tmp_path), "FULL_SHARD"))[0]
    empty = tmp_path / "empty"
    empty.mkdir()
    results = run_ranks(_resumed_without_checkpoint, 2, "shm", args=(str(empty),))
    with pytest.raises(AssertionError):
        _check_equal(results, reference)


def _resumed_without_checkpoint(rank, world_size, directory):
    model, optimizer = _job(rank, world_size, "FULL_SHARD")
    for step in range(SAVED_AFTER + 1, STEPS):
        _step(model, optimizer, step, rank, world_size)
    return model.full_state_dict()


def test_damaged_shard_is_named(tmp_path, saved_full_shard):
    tmp_path = Path(shutil.copytree(saved_full_shard[0], tmp_path / "saved"))
    [path] = [os.path.join(tmp_path, d) for d in os.listdir(tmp_path)]
    with open(os.path.join(path, "optimizer.shard3.safetensors"), "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02\x03")
    with pytest.raises(RankFailed, match=r"optimizer\.shard3\.safetensors"):
        run_ranks(_load_path, 2, "shm", args=(path,))


def _load_path(rank, world_size, path):
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    model, optimizer = _job(rank, world_size, "FULL_SHARD")
    DistributedCheckpointManager(os.path.dirname(path)).load_checkpoint(model, optimizer,
                                                                        path=path)
