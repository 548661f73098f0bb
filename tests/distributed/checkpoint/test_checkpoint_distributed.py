"""Checkpoints of real multi-process data-parallel jobs: resume is bit-identical, the world size
may change between save and resume, and errors on one rank stop every rank."""
from __future__ import annotations

import logging
import os

import numpy as np
import pytest

from dist_harness import run_ranks
from neural_arch.distributed.checkpoint import DistributedCheckpointManager
from neural_arch.nn.serialization import load_state_dict_file

from checkpoint_training_job import TrainingJob

pytestmark = pytest.mark.timeout(120)
TOTAL, SAVED_AFTER = 12, 5


def _rng_snapshot() -> dict:
    import neural_arch as na
    legacy = np.random.get_state(legacy=False)
    return {"framework": na.get_rng().bit_generator.state, "legacy_key": legacy["state"]["key"],
            "legacy_pos": legacy["state"]["pos"]}


def _save(manager, job, step, loss=1.0, **extra):
    return manager.save_checkpoint(job.model, job.optimizer, job.epoch_of(step), step, loss,
                                   scheduler=job.scheduler, sampler=job.sampler, **extra)


def _train_through(rank, world_size, directory, optimizer):
    """Uninterrupted run that saves a checkpoint on the way."""
    job = TrainingJob(optimizer, rank, world_size, distributed=True)
    manager = DistributedCheckpointManager(directory)
    for step in range(TOTAL):
        loss = job.step(step)
        if step == SAVED_AFTER:
            path = _save(manager, job, step, loss)
            assert os.path.isfile(os.path.join(path, "manifest.json"))  # in place on return
    return job.parameters()


def _resume(rank, world_size, directory, optimizer):
    from neural_arch.distributed.checkpoint import setup_fault_tolerant_training
    job = TrainingJob(optimizer, rank, world_size, distributed=True, init_seed=77)
    manager = DistributedCheckpointManager(directory)
    state = setup_fault_tolerant_training(job.model, job.optimizer, manager,
                                          scheduler=job.scheduler, sampler=job.sampler)
    assert state["start_step"] == SAVED_AFTER + 1
    for step in range(state["start_step"], TOTAL):
        job.step(step)
    return job.parameters()


@pytest.mark.parametrize("optimizer, backend", [("sgd", "shm"), ("adam", "shm"),
                                                ("sgd", "tcp")])
def test_two_rank_resume_is_bit_identical(tmp_path, optimizer, backend):
    uninterrupted = run_ranks(_train_through, 2, backend, args=(str(tmp_path), optimizer))
    resumed = run_ranks(_resume, 2, backend, args=(str(tmp_path), optimizer))
    for rank in range(2):
        for name, value in uninterrupted[rank].items():
            assert np.array_equal(resumed[rank][name], value), (rank, name)
            assert np.array_equal(value, uninterrupted[0][name])
    (path,) = DistributedCheckpointManager(tmp_path).list_checkpoints()
    assert sorted(os.listdir(path)) == ["manifest.json", "meta.json", "model.safetensors",
                                        "optimizer.safetensors", "rank0.json", "rank1.json"]
    # The DDP wrapper is saved as the model it wraps: no "module." prefix.
    assert sorted(load_state_dict_file(os.path.join(path, "model.safetensors"))) == sorted(
        uninterrupted[0])


def _save_with_two(rank, world_size, directory):
    job = TrainingJob("adam", rank, world_size, distributed=True)
    for step in range(3):
        job.step(step)
    _save(DistributedCheckpointManager(directory), job, 2)
    return job.parameters(), _rng_snapshot(), job.optimizer.state_dict()["state"]


def _load_with_three(rank, world_size, directory):
    job = TrainingJob("adam", rank, world_size, distributed=True, init_seed=5)
    info = DistributedCheckpointManager(directory).load_checkpoint(
        job.model, job.optimizer, scheduler=job.scheduler, sampler=job.sampler)
    loaded = (job.parameters(), _rng_snapshot(), job.optimizer.state_dict()["state"],
              job.sampler.epoch, info["world_size"])
    job.step(info["step"] + 1)  # and the grown job trains on
    assert all(np.all(np.isfinite(v)) for v in job.parameters().values())
    return loaded


def test_resume_with_world_size_two_to_three(tmp_path):
    saved = run_ranks(_save_with_two, 2, "shm", args=(str(tmp_path),))
    first = run_ranks(_load_with_three, 3, "shm", args=(str(tmp_path),))
    again = run_ranks(_load_with_three, 3, "shm", args=(str(tmp_path),))
    saved_params, _, saved_optimizer = saved[0]
    for rank in range(3):
        params, rng, optimizer_state, sampler_epoch, saved_world = first[rank]
        assert saved_world == 2 and sampler_epoch == 0
        assert all(np.array_equal(params[k], saved_params[k]) for k in saved_params)
        for index, entry in saved_optimizer.items():
            for key, value in entry.items():
                assert np.array_equal(optimizer_state[index][key], value)
        if rank < 2:  # ranks that existed get their own generators back
            assert rng["framework"] == saved[rank][1]["framework"]
            assert np.array_equal(rng["legacy_key"], saved[rank][1]["legacy_key"])
    # The new rank's streams: the same on every relaunch, and its own.
    new, relaunched = first[2][1], again[2][1]
    assert new["framework"] == relaunched["framework"]
    assert np.array_equal(new["legacy_key"], relaunched["legacy_key"])
    for rank in range(2):
        assert new["framework"] != first[rank][1]["framework"]
        assert not np.array_equal(new["legacy_key"], first[rank][1]["legacy_key"])


def _save_with_bad_state_on_rank_one(rank, world_size, directory):
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True)
    extra = {"ok": 1} if rank == 0 else {"ok": 1, "handle": object()}
    try:
        _save(DistributedCheckpointManager(directory), job, 0, additional_state=extra)
    except Exception as exc:
        return type(exc).__name__, str(exc)
    return None


def _save_with_different_steps(rank, world_size, directory):
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True)
    try:
        _save(DistributedCheckpointManager(directory), job, 3 + rank)
    except ValueError as exc:
        return str(exc)
    return None


def test_an_error_on_one_rank_stops_every_rank(tmp_path):
    outcomes = run_ranks(_save_with_bad_state_on_rank_one, 2, "shm", args=(str(tmp_path),))
    assert outcomes[1][0] == "TypeError" and "additional_state['handle']" in outcomes[1][1]
    assert outcomes[0][0] == "DistributedError"
    assert "rank 1 failed" in outcomes[0][1] and "additional_state['handle']" in outcomes[0][1]
    mismatched = run_ranks(_save_with_different_steps, 2, "shm", args=(str(tmp_path),))
    assert all("different (epoch, step) per rank: {0: (0, 3), 1: (0, 4)}" in m
               for m in mismatched)
    assert os.listdir(tmp_path) == []


def _save_three(rank, world_size, directory):
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True)
    paths = []
    for step in range(3):
        job.step(step)
        paths.append(_save(DistributedCheckpointManager(directory), job, step))
    return paths


def _load_agreeing(rank, world_size, directory):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("neural_arch.distributed.checkpoint").addHandler(handler)
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True)
    info = DistributedCheckpointManager(directory).load_checkpoint(job.model, job.optimizer)
    return info["step"], [r.getMessage() for r in records]


def test_ranks_fall_back_to_the_same_checkpoint(tmp_path):
    paths = run_ranks(_save_three, 2, "shm", args=(str(tmp_path),))[0]
    with open(os.path.join(paths[2], "rank1.json"), "a") as f:
        f.write(" ")  # only rank 1's file is damaged, yet both ranks must skip the checkpoint
    outcomes = run_ranks(_load_agreeing, 2, "shm", args=(str(tmp_path),))
    assert [step for step, _ in outcomes] == [1, 1]
    assert len(outcomes[0][1]) == 1 and "rank1.json" in outcomes[0][1][0]
    assert outcomes[1][1] == []  # rank 0 decides; the others follow


def _setup_then_load(rank, world_size, directory):
    from neural_arch.distributed.checkpoint import CheckpointError, setup_fault_tolerant_training
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True)
    manager = DistributedCheckpointManager(directory)
    fresh = setup_fault_tolerant_training(job.model, job.optimizer, manager)
    path = _save(manager, job, 0)
    if rank == 0:  # before its part of the collective load, which the others wait for
        with open(os.path.join(path, "meta.json"), "a") as f:
            f.write(" ")
    try:
        manager.load_checkpoint(job.model, job.optimizer)
    except CheckpointError as exc:
        return fresh, str(exc)
    return fresh, None


def test_fresh_start_and_no_good_checkpoint_agree_across_ranks(tmp_path):
    outcomes = run_ranks(_setup_then_load, 2, "shm", args=(str(tmp_path),))
    for fresh, error in outcomes:
        assert fresh["resumed"] is False and fresh["start_step"] == 0
        assert error is not None and "meta.json" in error
    assert "no usable checkpoint" in outcomes[0][1]
    assert "rank 0 could not choose a checkpoint" in outcomes[1][1]
