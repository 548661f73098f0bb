"""Checkpoints under faults: loading while another process saves, and damaged checkpoints.

A load never removes the temporary directory of a writer that still runs (only those whose
writer is gone), and reads the last complete checkpoint while saves go on. A checkpoint the
caller named is loaded or refused with ``CheckpointCorruptError`` naming the damaged file;
only "the newest" (no path given) falls back to an older good one, with a warning.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from neural_arch.distributed.checkpoint import (CheckpointCorruptError, CheckpointError,
                                                DistributedCheckpointManager, NoCheckpointError)
from neural_arch.distributed.checkpoint import format as checkpoint_format
from neural_arch.distributed.checkpoint import owner

from checkpoint_training_job import TrainingJob
from dist_harness import run_ranks
from repo_paths import REPO_ROOT, TESTS_DIR

pytestmark = pytest.mark.timeout(120)
LOGGER = "neural_arch.distributed.checkpoint"
SHORT = {"timeout": 20}  # a collective that regresses into a hang fails fast
# Under 2 busy CPUs a single save can take long; this only bounds a wait that should end.
WAIT_S = 90


def _child_env() -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)]))


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.wait(timeout=30)


def _temporaries(directory) -> list:
    return sorted(n for n in os.listdir(directory) if ".tmp-" in n or ".old-" in n)


# ----- a load while another process saves --------------------------------------------------------
# Every parameter of checkpoint ``s`` holds the value ``s``: a load that mixed files of two
# checkpoints, or read a half-written one, shows as parameters that differ from the step.
SAVING_WRITER = """
import os, sys, time
from neural_arch import nn
from neural_arch.distributed.checkpoint import DistributedCheckpointManager

directory, go, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
model = nn.Linear(1024, 512)  # 2 MiB of weights: each save takes a while
manager = DistributedCheckpointManager(directory, max_checkpoints=1)

def save(step):
    for parameter in model.parameters():
        parameter.array[...] = step
    manager.save_checkpoint(model, None, 0, step, None)

save(0)
deadline = time.monotonic() + {wait}
while not os.path.exists(go):  # the reader has loaded once: now save while it loads
    if time.monotonic() > deadline:
        sys.exit(3)
    time.sleep(0.01)
for step in range(1, count + 1):
    save(step)
"""


def test_loads_during_saves_read_complete_checkpoints_and_every_save_completes(tmp_path):
    from neural_arch import nn
    directory, go, count = tmp_path / "ckpt", tmp_path / "go", 30
    writer = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(SAVING_WRITER.format(wait=WAIT_S)),
         str(directory), str(go), str(count)],
        env=_child_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        model = nn.Linear(1024, 512)
        manager = DistributedCheckpointManager(directory)
        loads, deadline = [], time.monotonic() + 2 * WAIT_S
        while writer.poll() is None and time.monotonic() < deadline:
            try:
                info = manager.load_checkpoint(model, restore_rng=False)
            except NoCheckpointError:  # the writer has not finished its first save yet
                time.sleep(0.01)
                continue
            assert all(np.all(p.array == info["step"]) for p in model.parameters()), info
            loads.append(info["step"])
            go.touch()
        _, stderr = writer.communicate(timeout=WAIT_S)
    finally:
        _stop(writer)
    assert writer.returncode == 0, stderr
    assert loads and loads == sorted(loads)  # never an older state after a newer one
    info = manager.load_checkpoint(model, restore_rng=False)
    assert info["step"] == count and all(np.all(p.array == count) for p in model.parameters())
    assert _temporaries(directory) == []


# ----- whose temporary directory is removed ------------------------------------------------------
# A writer that stops just before renaming its finished temporary directory into place, until
# told to go on (a line on stdin); it prints the temporary directory's path first.
PAUSED_WRITER = """
import os, sys
from neural_arch.distributed.checkpoint import DistributedCheckpointManager
from neural_arch.distributed.checkpoint import format as checkpoint_format
from checkpoint_training_job import TrainingJob

class PauseBeforeRename:
    def __getattr__(self, name):
        return getattr(os, name)
    def rename(self, src, dst):
        if ".tmp-" in os.path.basename(src):
            print(src, flush=True)
            sys.stdin.readline()
        os.rename(src, dst)

job = TrainingJob()
job.step(0)
checkpoint_format.os = PauseBeforeRename()
DistributedCheckpointManager(sys.argv[1]).save_checkpoint(job.model, job.optimizer, 0,
                                                          int(sys.argv[2]), 0.5)
"""


def _paused_writer(directory, step: int):
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(PAUSED_WRITER),
                             str(directory), str(step)], env=_child_env(), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    temporary = proc.stdout.readline().strip()
    if not temporary:
        _stop(proc)
        pytest.fail(f"the writer did not reach its rename: {proc.stderr.read()}")
    return proc, temporary


@pytest.fixture
def two_saved(tmp_path):
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path)
    paths = []
    for step in range(2):
        job.step(step)
        paths.append(manager.save_checkpoint(job.model, job.optimizer, 0, step, 1.0))
    return manager, job, paths


@pytest.fixture
def three_saved(tmp_path):
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path)
    paths, weights = [], []
    for step in range(3):
        job.step(step)
        paths.append(manager.save_checkpoint(job.model, job.optimizer, 0, step, 1.0))
        weights.append(job.parameters())
    return manager, paths, weights


def test_a_live_writers_temporary_survives_loads_and_saves(two_saved):
    manager, job, paths = two_saved
    writer, temporary = _paused_writer(manager.checkpoint_dir, 5)
    try:
        assert os.path.isdir(temporary)
        assert manager.load_checkpoint(restore_rng=False)["path"] == paths[1]
        job.step(2)
        manager.save_checkpoint(job.model, job.optimizer, 0, 2, 1.0)  # a second writer
        assert os.path.isdir(temporary)
        _, stderr = writer.communicate("go\n", timeout=WAIT_S)
    finally:
        _stop(writer)
    assert writer.returncode == 0, stderr
    assert manager.load_checkpoint(restore_rng=False)["step"] == 5
    assert _temporaries(manager.checkpoint_dir) == []


def test_the_temporary_of_a_killed_writer_is_removed_with_a_warning(two_saved, caplog):
    manager, _, paths = two_saved
    writer, temporary = _paused_writer(manager.checkpoint_dir, 5)
    try:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=30)
    finally:
        _stop(writer)
    assert os.path.isdir(temporary)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert manager.load_checkpoint(restore_rng=False)["path"] == paths[1]
    assert not os.path.exists(temporary)
    assert any(os.path.basename(temporary) in r.getMessage() for r in caplog.records)


def test_temporaries_are_judged_by_their_recorded_writer(two_saved, caplog):
    """Removed: a writer whose pid now belongs to a later process. Kept: this process's own
    (it is running), and one from another host, which cannot be checked from here."""
    manager, _, _ = two_saved
    me = owner.this_process()
    writers = {"reused pid": dataclasses.replace(me, start=me.start + 1),
               "running": me,
               "other host": dataclasses.replace(me, host="0123456789abcdef")}
    names = {what: f"ckpt-e000000-s00000009.tmp-{writer}-0abc1234"
             for what, writer in writers.items()}
    for name in names.values():
        os.mkdir(os.path.join(manager.checkpoint_dir, name))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        manager.load_checkpoint(restore_rng=False)
    assert _temporaries(manager.checkpoint_dir) == sorted([names["running"],
                                                           names["other host"]])
    assert any(names["reused pid"] in r.getMessage() for r in caplog.records)


# ----- a checkpoint removed or replaced while it is being read -----------------------------------
class _ActOnOpen:
    """Stands in for ``os`` in the checkpoint format module: the first time a file named
    ``trigger`` is opened, ``action`` runs first (another process's save, played here)."""

    def __init__(self, trigger: str, action) -> None:
        self.trigger, self.action = trigger, action

    def __getattr__(self, name):
        return getattr(os, name)

    def open(self, path, *args, **kwargs):
        if self.action is not None and os.path.basename(path) == self.trigger:
            action, self.action = self.action, None
            action()
        return os.open(path, *args, **kwargs)


def test_a_checkpoint_rotated_away_while_being_read_is_not_reported_damaged(three_saved,
                                                                          monkeypatch, caplog):
    manager, paths, weights = three_saved
    monkeypatch.setattr(checkpoint_format, "os", _ActOnOpen(
        "model.safetensors", lambda: shutil.rmtree(paths[2])))
    target = TrainingJob(init_seed=7)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        info = manager.load_checkpoint(target.model, target.optimizer)
    assert info["path"] == paths[1]
    assert all(np.array_equal(target.parameters()[k], weights[1][k]) for k in weights[1])
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("named", [False, True])
def test_a_checkpoint_saved_again_while_being_read_is_read_whole(three_saved, monkeypatch,
                                                                 caplog, named):
    manager, paths, _ = three_saved
    job = TrainingJob()
    for step in range(4):
        job.step(step)  # other weights than those saved at step 2

    def save_step_two_again():
        manager.save_checkpoint(job.model, job.optimizer, 0, 2, 0.25)

    monkeypatch.setattr(checkpoint_format, "os", _ActOnOpen("model.safetensors",
                                                             save_step_two_again))
    target = TrainingJob(init_seed=7)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        info = manager.load_checkpoint(target.model, target.optimizer,
                                       path=paths[2] if named else None)
    assert info["path"] == paths[2] and info["loss"] == 0.25
    saved_again = job.parameters()
    assert all(np.array_equal(target.parameters()[k], saved_again[k]) for k in saved_again)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def _load_while_rank_one_sees_a_rotation(rank, world_size, newest):
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger(LOGGER).addHandler(handler)
    if rank == 1:  # after rank 0 chose the newest, another process rotates it away
        checkpoint_format.os = _ActOnOpen("meta.json", lambda: shutil.rmtree(newest))
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True, init_seed=7)
    info = DistributedCheckpointManager(os.path.dirname(newest)).load_checkpoint(
        job.model, job.optimizer)
    return info["step"], job.parameters(), [r.getMessage() for r in records]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_group_chooses_again_when_the_chosen_checkpoint_goes_before_all_read_it(
        three_saved, backend):
    _, paths, weights = three_saved
    outcomes = run_ranks(_load_while_rank_one_sees_a_rotation, 2, backend, timeout=60,
                         args=(paths[2],), init_kwargs=SHORT)
    for step, parameters, warnings in outcomes:
        assert step == 1 and warnings == []
        assert all(np.array_equal(parameters[k], weights[1][k]) for k in weights[1])


# ----- damaged checkpoints: a named one is refused, the newest falls back ------------------------
def _truncate(path: str) -> None:
    name = os.path.join(path, "model.safetensors")
    with open(name, "r+b") as f:
        f.truncate(os.path.getsize(name) // 2)


def _flip_bit(path: str) -> None:
    name = os.path.join(path, "optimizer.safetensors")
    data = bytearray(open(name, "rb").read())
    data[len(data) // 2] ^= 0x10
    with open(name, "wb") as f:
        f.write(bytes(data))


DAMAGE = {"truncated": (_truncate, "model.safetensors", "truncated"),
          "bit flipped": (_flip_bit, "optimizer.safetensors", "SHA-256")}


@pytest.mark.parametrize("damage", sorted(DAMAGE))
@pytest.mark.parametrize("which", [1, 2])  # an older one, and the newest
def test_a_named_damaged_checkpoint_is_refused_naming_the_file(three_saved, damage, which,
                                                               caplog):
    manager, paths, _ = three_saved
    corrupt, bad_file, reason = DAMAGE[damage]
    corrupt(paths[which])
    target = TrainingJob(init_seed=7)
    before = target.parameters()
    with caplog.at_level(logging.WARNING, logger=LOGGER), \
            pytest.raises(CheckpointCorruptError) as err:
        manager.load_checkpoint(target.model, target.optimizer, path=paths[which])
    assert err.value.directory == paths[which] and err.value.file == bad_file
    assert paths[which] in str(err.value) and bad_file in str(err.value)
    assert reason in str(err.value)
    assert all(np.array_equal(target.parameters()[k], before[k]) for k in before)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_the_newest_falls_back_to_an_older_good_one_with_a_warning(three_saved, damage, caplog):
    manager, paths, weights = three_saved
    corrupt, bad_file, reason = DAMAGE[damage]
    corrupt(paths[2])
    target = TrainingJob(init_seed=7)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        info = manager.load_checkpoint(target.model, target.optimizer)
    assert info["path"] == paths[1]
    assert all(np.array_equal(target.parameters()[k], weights[1][k]) for k in weights[1])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and bad_file in warnings[0] and reason in warnings[0]
    # A good older checkpoint named explicitly loads even though the newest is damaged.
    assert manager.load_checkpoint(path=paths[0], restore_rng=False)["step"] == 0


def _load_named(rank, world_size, path):
    job = TrainingJob(rank=rank, world_size=world_size, distributed=True, init_seed=7)
    before = job.parameters()
    manager = DistributedCheckpointManager(os.path.dirname(path))
    try:
        manager.load_checkpoint(job.model, job.optimizer, path=path)
    except CheckpointError as exc:
        unchanged = all(np.array_equal(job.parameters()[k], before[k]) for k in before)
        return type(exc).__name__, str(exc), unchanged
    return None


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_every_rank_refuses_a_named_damaged_checkpoint(three_saved, backend, damage):
    _, paths, _ = three_saved
    corrupt, bad_file, _ = DAMAGE[damage]
    corrupt(paths[1])
    outcomes = run_ranks(_load_named, 2, backend, timeout=60, args=(paths[1],),
                         init_kwargs=SHORT)
    assert outcomes[0][0] == "CheckpointCorruptError"
    for outcome in outcomes:
        assert outcome is not None, "a rank loaded a damaged checkpoint or an older one"
        _, message, unchanged = outcome
        assert paths[1] in message and bad_file in message and unchanged
