"""Checkpoint round trips in one process: continuing from a checkpoint matches an uninterrupted
run bit for bit; the files hold JSON and safetensors only; rotation; the seed's usage."""
from __future__ import annotations

import json
import math
import os
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import neural_arch as na
from neural_arch.distributed.checkpoint import (DistributedCheckpointManager, NoCheckpointError,
                                                setup_fault_tolerant_training)
from neural_arch.distributed.checkpoint.values import decode, encode
from neural_arch.distributed.ddp.loss_scaler import LossScaler
from neural_arch.nn.serialization import load_state_dict_file

from checkpoint_training_job import TrainingJob

pytestmark = pytest.mark.timeout(60)


def _params_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _save(manager, job, step, loss=0.5, **extra):
    return manager.save_checkpoint(job.model, job.optimizer, job.epoch_of(step), step, loss,
                                   scheduler=job.scheduler, sampler=job.sampler, **extra)


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
def test_resumed_training_is_bit_identical(tmp_path, optimizer):
    total, saved_after = 14, 6
    reference = TrainingJob(optimizer)
    for step in range(total):
        reference.step(step)

    first = TrainingJob(optimizer)
    manager = DistributedCheckpointManager(tmp_path)
    for step in range(saved_after + 1):
        loss = first.step(step)
    _save(manager, first, saved_after, loss, additional_state={"note": "mid-run"})
    first.step(saved_after + 1)  # work after the checkpoint is lost with the process

    # A new "process": other initial weights and other generator states until resume.
    resumed = TrainingJob(optimizer, init_seed=99)
    na.manual_seed(12345)
    np.random.seed(54321)
    state = setup_fault_tolerant_training(resumed.model, resumed.optimizer, manager,
                                          scheduler=resumed.scheduler, sampler=resumed.sampler)
    assert state["resumed"] and state["start_step"] == saved_after + 1
    assert state["start_epoch"] == first.epoch_of(saved_after)
    assert state["additional_state"] == {"note": "mid-run"}
    assert state["best_loss"] == loss
    for step in range(state["start_step"], total):
        resumed.step(step)
    assert _params_equal(resumed.parameters(), reference.parameters())
    assert resumed.scheduler.get_last_lr() == reference.scheduler.get_last_lr()


def test_every_piece_of_state_round_trips(tmp_path):
    job = TrainingJob("adam")
    for step in range(12):  # into the second epoch, so the sampler's epoch is 1
        job.step(step)
    scaler = LossScaler(init_scale=1024.0, growth_interval=3)
    scaler.update(False)
    scaler.update(True)
    scaler.update(False)
    manager = DistributedCheckpointManager(tmp_path)
    path = _save(manager, job, 11, loss=float("nan"), loss_scaler=scaler,
                 additional_state={"lr": 0.25, "pair": (1, 2), "nested": {"x": [1, None]}})
    framework_state = na.get_rng().bit_generator.state
    legacy_state = np.random.get_state(legacy=False)
    saved_optimizer = job.optimizer.state_dict()

    other = TrainingJob("adam", init_seed=5)
    other_scaler = LossScaler()
    na.get_rng().random(10)
    np.random.random(10)
    info = manager.load_checkpoint(other.model, other.optimizer, scheduler=other.scheduler,
                                   loss_scaler=other_scaler, sampler=other.sampler)

    assert info["path"] == path and info["step"] == 11 and info["world_size"] == 1
    assert math.isnan(info["loss"]) and info["best_loss"] == math.inf
    assert info["additional_state"] == {"lr": 0.25, "pair": (1, 2), "nested": {"x": [1, None]}}
    assert _params_equal(other.parameters(), job.parameters())
    restored = other.optimizer.state_dict()
    assert restored["param_groups"] == saved_optimizer["param_groups"]
    for index, entry in saved_optimizer["state"].items():
        assert entry.keys() == restored["state"][index].keys()
        for key, value in entry.items():
            assert np.array_equal(restored["state"][index][key], value)
    assert other.scheduler.state_dict()["last_epoch"] == job.scheduler.state_dict()["last_epoch"]
    assert other_scaler.state_dict() == scaler.state_dict()
    assert other.sampler.epoch == job.sampler.epoch == 1
    assert na.get_rng().bit_generator.state == framework_state
    restored_legacy = np.random.get_state(legacy=False)
    assert np.array_equal(restored_legacy["state"]["key"], legacy_state["state"]["key"])
    assert restored_legacy["state"]["pos"] == legacy_state["state"]["pos"]


def test_model_wrapper_is_saved_without_module_prefix(tmp_path):
    class Wrapper:  # the shape of a data-parallel wrapper: the model sits in ``.module``
        def __init__(self, module):
            self.module = module

    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path)
    path = manager.save_checkpoint(Wrapper(job.net), job.optimizer, 0, 0, 1.0)
    weights = load_state_dict_file(os.path.join(path, "model.safetensors"))
    assert sorted(weights) == sorted(job.net.state_dict())
    target = TrainingJob(init_seed=3)
    manager.load_checkpoint(Wrapper(target.net))
    assert _params_equal(target.parameters(), job.parameters())


def _pickle_free(path: str) -> None:
    """Each file is JSON, or safetensors: an 8-byte header length, a JSON header, and exactly
    the tensor bytes the header describes (no room for anything else)."""
    for name in sorted(os.listdir(path)):
        data = open(os.path.join(path, name), "rb").read()
        assert not data.startswith(b"\x80"), f"{name} starts like a pickle"
        if name.endswith(".json"):
            json.loads(data.decode("utf-8"))
            continue
        assert name.endswith(".safetensors"), name
        (length,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8:8 + length])
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        assert 8 + length + max(ends, default=0) == len(data), name


def test_files_are_json_and_safetensors_only(tmp_path):
    job = TrainingJob("adam")
    job.step(0)
    manager = DistributedCheckpointManager(tmp_path)
    path = _save(manager, job, 0, additional_state={"lr": 0.1}, loss_scaler=LossScaler())
    assert sorted(os.listdir(path)) == ["manifest.json", "meta.json", "model.safetensors",
                                        "optimizer.safetensors", "rank0.json"]
    _pickle_free(path)
    manifest = json.load(open(os.path.join(path, "manifest.json")))
    assert sorted(manifest["files"]) == ["meta.json", "model.safetensors",
                                         "optimizer.safetensors", "rank0.json"]
    for name, entry in manifest["files"].items():
        assert entry["size"] == os.path.getsize(os.path.join(path, name))
    assert manager.latest() == path


@pytest.mark.parametrize("bad, where", [
    ({"lr": 0.1, "model": object()}, "additional_state['model']"),
    ({"nested": {"weights": np.zeros(3)}}, "additional_state['nested']['weights']"),
    ({"count": np.int64(3)}, "additional_state['count']"),
    ({"seen": {1, 2}}, "additional_state['seen']"),
    ({1: "non-string key"}, "additional_state"),
])
def test_non_json_additional_state_raises_type_error_naming_the_key(tmp_path, bad, where):
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path)
    with pytest.raises(TypeError) as err:
        manager.save_checkpoint(job.model, job.optimizer, 0, 3, 1.0, additional_state=bad)
    assert where in str(err.value)
    assert os.listdir(tmp_path) == []  # nothing written, not even a temporary directory


def test_rotation_keeps_the_newest_and_never_the_one_just_written_is_lost(tmp_path):
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path, max_checkpoints=3)
    for step in range(6):
        _save(manager, job, step)
    assert [os.path.basename(p) for p in manager.list_checkpoints()] == [
        "ckpt-e000000-s00000003", "ckpt-e000000-s00000004", "ckpt-e000000-s00000005"]
    # An older step saved last (e.g. a rerun) is kept although it is the oldest.
    _save(manager, job, 1)
    names = [os.path.basename(p) for p in manager.list_checkpoints()]
    assert "ckpt-e000000-s00000001" in names and len(names) == 4


def test_rotation_counts_only_good_checkpoints(tmp_path):
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path, max_checkpoints=2)
    paths = [_save(manager, job, step) for step in range(2)]
    with open(os.path.join(paths[1], "model.safetensors"), "r+b") as f:
        f.truncate(10)  # the newer of the two is now corrupt
    newest = _save(manager, job, 2)
    # Two good ones remain (steps 0 and 2); the corrupt one does not count and is not deleted.
    assert manager.list_checkpoints() == [paths[0], paths[1], newest]
    _save(manager, job, 3)
    assert [os.path.basename(p) for p in manager.list_checkpoints()] == [
        "ckpt-e000000-s00000002", "ckpt-e000000-s00000003"]


def test_same_step_saved_twice_keeps_the_newer_state(tmp_path):
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path)
    _save(manager, job, 2, additional_state={"version": 1})
    _save(manager, job, 2, additional_state={"version": 2})
    assert len(manager.list_checkpoints()) == 1
    assert manager.load_checkpoint()["additional_state"] == {"version": 2}
    assert os.listdir(tmp_path) == ["ckpt-e000000-s00000002"]


def test_fresh_start_and_load_without_checkpoints(tmp_path):
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path / "new")
    state = setup_fault_tolerant_training(job.model, job.optimizer, manager)
    assert state == {"start_epoch": 0, "start_step": 0, "best_loss": math.inf, "resumed": False,
                     "checkpoint": None, "loss": None, "additional_state": None}
    assert manager.latest() is None
    with pytest.raises(NoCheckpointError, match="no checkpoint in"):
        manager.load_checkpoint(job.model)


def test_bad_arguments_are_rejected(tmp_path):
    job = TrainingJob()
    with pytest.raises(ValueError, match="max_checkpoints must be a positive integer, got 0"):
        DistributedCheckpointManager(tmp_path, max_checkpoints=0)
    manager = DistributedCheckpointManager(tmp_path)
    with pytest.raises(ValueError, match="step must be a non-negative integer, got -1"):
        manager.save_checkpoint(job.model, job.optimizer, 0, -1, 1.0)
    with pytest.raises(ValueError, match="needs an initialized process group"):
        DistributedCheckpointManager(tmp_path, rank=0, world_size=2).save_checkpoint(
            job.model, job.optimizer, 0, 0, 1.0)
    manager.save_checkpoint(job.model, None, 0, 0, 1.0)
    with pytest.raises(ValueError, match="holds no optimizer state"):
        manager.load_checkpoint(job.model, job.optimizer)
    sgd_state = manager.save_checkpoint(job.model, job.optimizer, 0, 1, 1.0)
    adam = TrainingJob("adam")
    before = adam.parameters()
    with pytest.raises(ValueError, match="holds SGD state, the optimizer is a Adam"):
        manager.load_checkpoint(adam.model, adam.optimizer, path=sgd_state)
    assert _params_equal(adam.parameters(), before)  # nothing was half loaded


@pytest.mark.parametrize("value", [
    0, -3, 2 ** 80, 1.5, float("inf"), float("-inf"), "text", None, True, (1, (2.5, "x")),
    [1, [2, {"k": (3,)}]], {"__nf__": "user data"}, {1: "a", (2, 3): "b"},
    np.float32(0.1), np.int8(-4), np.bool_(True),
    np.arange(6, dtype=np.float64).reshape(2, 3), np.array([1, 2], dtype=np.uint16)])
def test_codec_round_trips_through_json(value):
    restored = decode(json.loads(json.dumps(encode(value), allow_nan=False)))
    if isinstance(value, np.ndarray):
        assert restored.dtype == value.dtype and np.array_equal(restored, value)
    else:
        assert restored == value and type(restored) is type(value)


_JSON_LEAVES = (st.none() | st.booleans() | st.integers() | st.text(max_size=8)
                | st.floats(allow_nan=False))
_NESTED = st.recursive(_JSON_LEAVES, lambda inner: st.lists(inner, max_size=4)
                       | st.tuples(inner, inner)
                       | st.dictionaries(st.text(max_size=6) | st.integers(), inner, max_size=4),
                       max_leaves=20)


@settings(max_examples=150, deadline=None)
@given(_NESTED)
def test_codec_round_trips_nested_data(value):
    assert decode(json.loads(json.dumps(encode(value), allow_nan=False))) == value


def test_seed_usage_runs_as_printed(tmp_path, monkeypatch):
    """The fault-tolerant training example of the seed document, with its names defined."""
    monkeypatch.chdir(tmp_path)
    from neural_arch.distributed.advanced import (DistributedCheckpointManager,
                                                  setup_fault_tolerant_training)
    job = TrainingJob()
    model, optimizer, num_epochs, current_lr = job.model, job.optimizer, 3, 0.05
    dataloader = range(job.steps_per_epoch)
    step_counter = iter(range(10 ** 6))

    def train_step(batch):
        return na.Tensor(np.float32(job.step(next(step_counter))))

    checkpoint_manager = DistributedCheckpointManager(
        checkpoint_dir="./checkpoints",
        max_checkpoints=5
    )
    training_state = setup_fault_tolerant_training(
        model, optimizer, checkpoint_manager
    )
    for epoch in range(training_state['start_epoch'], num_epochs):
        for step, batch in enumerate(dataloader):
            loss = train_step(batch)
            if step % 100 == 0:
                checkpoint_manager.save_checkpoint(
                    model=model,
                    optimizer=optimizer,
                    epoch=epoch,
                    step=step,
                    loss=float(loss.array),
                    additional_state={'lr': current_lr}
                )

    assert sorted(os.listdir("checkpoints")) == [
        "ckpt-e000000-s00000000", "ckpt-e000001-s00000000", "ckpt-e000002-s00000000"]
    fresh = TrainingJob()
    again = setup_fault_tolerant_training(fresh.model, fresh.optimizer,
                                          DistributedCheckpointManager("./checkpoints"))
    assert (again["start_epoch"], again["start_step"], again["resumed"]) == (2, 1, True)
