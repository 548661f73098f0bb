"""Damaged checkpoints are detected: loading the newest falls back to the previous good one
with a warning naming the bad file, and fails clearly only when none is good; a checkpoint
named by its path is refused, naming the bad file."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from neural_arch.distributed.checkpoint import (CheckpointCorruptError, CheckpointError,
                                                DistributedCheckpointManager)

from checkpoint_training_job import TrainingJob
from repo_paths import REPO_ROOT, TESTS_DIR

pytestmark = pytest.mark.timeout(60)
LOGGER = "neural_arch.distributed.checkpoint"


@pytest.fixture
def saved(tmp_path):
    """Three checkpoints (steps 0, 1, 2) and the weights each one holds."""
    job = TrainingJob()
    manager = DistributedCheckpointManager(tmp_path)
    paths, weights = [], []
    for step in range(3):
        job.step(step)
        paths.append(manager.save_checkpoint(job.model, job.optimizer, 0, step, 1.0 / (step + 1),
                                             scheduler=job.scheduler))
        weights.append(job.parameters())
    return manager, paths, weights


def _rewrite_listed(path: str, name: str, data: bytes) -> None:
    """Replace a file and fix its manifest entry, so only the content itself is wrong."""
    with open(os.path.join(path, name), "wb") as f:
        f.write(data)
    manifest_path = os.path.join(path, "manifest.json")
    manifest = json.load(open(manifest_path))
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    with open(manifest_path, "w") as f:
        json.dump(manifest, f)


def _truncate(path):
    with open(os.path.join(path, "model.safetensors"), "r+b") as f:
        f.truncate(os.path.getsize(os.path.join(path, "model.safetensors")) // 2)


def _flip_byte(path):
    name = os.path.join(path, "optimizer.safetensors")
    data = bytearray(open(name, "rb").read())
    data[-1] ^= 0x01
    open(name, "wb").write(bytes(data))


CORRUPTIONS = {
    "truncated file": (_truncate, "model.safetensors", "truncated"),
    "changed byte": (_flip_byte, "optimizer.safetensors", "SHA-256"),
    "missing manifest": (lambda p: os.remove(os.path.join(p, "manifest.json")),
                         "manifest.json", "missing"),
    "manifest not JSON": (lambda p: open(os.path.join(p, "manifest.json"), "w").write("{oops"),
                          "manifest.json", "bad JSON"),
    "meta not JSON": (lambda p: _rewrite_listed(p, "meta.json", b'{"epoch": 0,'),
                      "meta.json", "bad json content"),
    "weights not safetensors": (lambda p: _rewrite_listed(p, "model.safetensors", b"\x10" * 64),
                                "model.safetensors", "bad safetensors content"),
    "missing rank file": (lambda p: os.remove(os.path.join(p, "rank0.json")),
                          "rank0.json", "missing"),
}


@pytest.mark.parametrize("case", sorted(CORRUPTIONS))
def test_falls_back_to_previous_good_checkpoint(saved, case, caplog):
    manager, paths, weights = saved
    corrupt, bad_file, reason = CORRUPTIONS[case]
    corrupt(paths[2])
    target = TrainingJob(init_seed=7)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        info = manager.load_checkpoint(target.model, target.optimizer,
                                       scheduler=target.scheduler)
    assert info["path"] == paths[1] and info["step"] == 1
    assert all(np.array_equal(target.parameters()[k], weights[1][k]) for k in weights[1])
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert paths[2] in warnings[0] and bad_file in warnings[0] and reason in warnings[0]
    assert manager.latest() == paths[1]


def test_explicit_path_is_loaded_or_refused_never_swapped(saved):
    manager, paths, _ = saved
    _truncate(paths[1])
    with pytest.raises(CheckpointCorruptError, match="model.safetensors") as err:
        manager.load_checkpoint(path=paths[1], restore_rng=False)
    assert err.value.directory == paths[1] and err.value.file == "model.safetensors"


def test_no_good_checkpoint_is_a_clear_error(saved, caplog):
    manager, paths, _ = saved
    for path in paths:
        _truncate(path)
    with caplog.at_level(logging.WARNING, logger=LOGGER), \
            pytest.raises(CheckpointError, match="no usable checkpoint") as err:
        manager.load_checkpoint(restore_rng=False)
    assert str(err.value).count("model.safetensors") == 3
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 3


CRASHING_SAVE = """
import os, sys
from neural_arch.distributed.checkpoint import DistributedCheckpointManager
from neural_arch.distributed.checkpoint import format as checkpoint_format
sys.path.insert(0, {tests!r})
from checkpoint_training_job import TrainingJob

class CrashOnRename:  # the process dies after every file is written, before the rename
    def __getattr__(self, name):
        return getattr(os, name)
    def rename(self, src, dst):
        os._exit(42)

job = TrainingJob()
job.step(0)
checkpoint_format.os = CrashOnRename()
DistributedCheckpointManager({directory!r}).save_checkpoint(job.model, job.optimizer, 0, 9, 0.1)
"""


def test_directory_left_by_a_crash_before_rename_is_ignored_and_removed(saved, caplog):
    manager, paths, _ = saved
    script = CRASHING_SAVE.format(tests=str(TESTS_DIR), directory=manager.checkpoint_dir)
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    crashed = subprocess.run([sys.executable, "-c", textwrap.dedent(script)], env=env,
                             capture_output=True, text=True, timeout=60)
    assert crashed.returncode == 42, crashed.stderr
    left = [n for n in os.listdir(manager.checkpoint_dir) if ".tmp-" in n]
    assert len(left) == 1 and left[0].startswith("ckpt-e000000-s00000009.tmp-")
    assert "manifest.json" in os.listdir(os.path.join(manager.checkpoint_dir, left[0]))
    # A second one that died earlier, before its manifest.
    partial = os.path.join(manager.checkpoint_dir, "ckpt-e000000-s00000010.tmp-0badc0de")
    shutil.copytree(paths[2], partial)
    os.remove(os.path.join(partial, "manifest.json"))

    assert manager.latest() == paths[2]  # temporary directories are never candidates
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        info = manager.load_checkpoint(restore_rng=False)
    assert info["path"] == paths[2]
    assert sorted(os.listdir(manager.checkpoint_dir)) == sorted(os.path.basename(p)
                                                                for p in paths)
    removed = " ".join(r.getMessage() for r in caplog.records)
    assert left[0] in removed and "ckpt-e000000-s00000010.tmp-0badc0de" in removed
