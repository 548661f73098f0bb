"""Resuming when one rank's newest checkpoint is damaged: the whole job takes the newest step
that is intact for every rank, and the rank that found the damage names the bad file.

Tensor-parallel ranks checkpoint into directories of their own (each its shards, over its
data-parallel group), so a damaged file is seen by one of them only; without agreement over
the world, that rank would fall back to an older step while the others went on from the newest
and trained against it. Here: the Trainer in that layout (``resume_agreement_job``, 4
processes: 2 columns of 2 data-parallel ranks), and ``train_gpt --tp 2`` and ``--pp 2`` at two
processes.
"""
from __future__ import annotations

import functools
import json
import os
import sys

import numpy as np
import pytest

from dist_harness import run_ranks
from repo_paths import TESTS_DIR
from resume_agreement_job import BAD_FILE, column_dir, damage, step_dir, train_columns

sys.path.insert(0, str(TESTS_DIR / "training"))
import train_gpt_support  # noqa: E402
from train_gpt_support import MODEL, losses, write_text  # noqa: E402

pytestmark = pytest.mark.timeout(180)
SHORT = {"timeout": 30}  # a rank left waiting by a disagreement fails fast
# train_gpt's runs are checked by their output and metrics.jsonl: without tensorboardX (and the
# torch it imports, seconds of rank 0's start-up)
run = functools.partial(train_gpt_support.run, tensorboard=False)
WORLD, COLUMNS = 4, 2


def _train(root, max_steps, resume, backend, expect_error=False):
    return run_ranks(train_columns, WORLD, backend, timeout=120, init_kwargs=SHORT,
                     args=(str(root), COLUMNS, max_steps, resume, True, expect_error))


def _assert_same_weights(outcomes, reference):
    for outcome in outcomes:
        for name, value in reference.items():
            np.testing.assert_allclose(outcome["weights"][name], value, rtol=1e-6,
                                       err_msg=f"rank of column {outcome['column']}: {name}")


# ----- the Trainer, tensor-parallel layout ----------------------------------------------------
@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_damaged_newest_checkpoint_in_one_column_takes_every_rank_back_a_step(tmp_path,
                                                                                 backend):
    root = tmp_path / "run"
    _train(root, 4, False, backend)  # saves steps 2 and 4 in each column's directory
    bad = damage(step_dir(root, 1, 4))
    resumed = _train(root, 6, True, backend)
    assert [o["start"] for o in resumed] == [2] * WORLD, "ranks resumed from different steps"
    assert [o["steps"] for o in resumed] == [6] * WORLD
    # column 1's first rank read the damaged file: its warning names the file and the damage
    assert any(step_dir(root, 1, 4) in w and BAD_FILE in w and "SHA-256" in w
               for w in resumed[1]["warnings"]), resumed[1]["warnings"]
    assert os.path.isfile(bad)
    # column 0's newest was intact: it says that it goes back to the step intact everywhere
    assert any(step_dir(root, 0, 4) in w and step_dir(root, 0, 2) in w
               for w in resumed[0]["warnings"]), resumed[0]["warnings"]
    for column in range(COLUMNS):
        assert os.path.isdir(step_dir(root, column, 6))
    uninterrupted = _train(tmp_path / "uninterrupted", 6, False, backend)
    _assert_same_weights(resumed, uninterrupted[0]["weights"])


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_no_step_intact_in_every_column_stops_every_rank(tmp_path, backend):
    root = tmp_path / "run"
    _train(root, 4, False, backend)
    for step in (2, 4):
        damage(step_dir(root, 1, step))
    again = _train(root, 4, True, backend, expect_error=True)
    for outcome in again:  # every rank, not only column 1's: nobody trains on alone
        assert outcome["error"] == "CheckpointError", outcome
        assert "no checkpoint step is intact on every rank" in outcome["message"], outcome
        assert column_dir(root, 1) + " holds no intact checkpoint" in outcome["message"]
    warnings = " ".join(again[1]["warnings"])
    for step in (2, 4):
        assert f"{step_dir(root, 1, step)} is unusable: {BAD_FILE} is bad" in warnings
    for column in range(COLUMNS):  # nothing was trained or saved over the damaged run
        assert not os.path.isdir(step_dir(root, column, 6))


def _resume_group_without_the_checkpoint_group(rank, world_size, root):
    from neural_arch import distributed as dist
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    alone = [dist.new_group([r]) for r in range(world_size)][rank]
    manager = DistributedCheckpointManager(os.path.join(root, f"r{rank}"), resume_group=alone)
    try:
        manager.load_checkpoint()
    except ValueError as exc:
        return str(exc)
    return "loaded"


def test_a_resume_group_must_hold_the_checkpoint_group(tmp_path):
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    with pytest.raises(TypeError, match="resume_group must be a ProcessGroup or None"):
        DistributedCheckpointManager(tmp_path, resume_group="world")
    messages = run_ranks(_resume_group_without_the_checkpoint_group, 2, "shm", timeout=60,
                         init_kwargs=SHORT, args=(str(tmp_path),))
    for rank, message in enumerate(messages):
        assert f"resume_group (ranks [{rank}])" in message and "[0, 1]" in message, message


# ----- train_gpt --tp 2 and --pp 2 ------------------------------------------------------------
SAVES = ["--save-interval", 2, "--backend", "shm", "--batch-size", 8]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("data") / "text.txt")


@pytest.fixture(scope="module")
def reference(text, tmp_path_factory):
    """Six steps in one process: what any resumed run's steps must follow."""
    out = tmp_path_factory.mktemp("runs") / "reference"
    run("--data", text, *MODEL, *SAVES, "--max-steps", 6, "--out-dir", out)
    return str(out)


def _resumed_train_records(out, records_before):
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        lines = [json.loads(line) for line in handle][records_before:]
    return [r for r in lines if r["kind"] == "train"]


def _resume_after_damage(text, out, flags, damaged_dir, damaged_file):
    """Four steps, saved at 2 and 4; damage one file of step 4; resume to step 6."""
    run("--data", text, *MODEL, *SAVES, "--max-steps", 4, "--out-dir", out, *flags, launcher=2)
    with open(os.path.join(out, "metrics.jsonl")) as handle:
        before = len(handle.readlines())
    damage(damaged_dir, damaged_file)
    result = run("--data", text, *MODEL, *SAVES, "--max-steps", 6, "--out-dir", out, *flags,
                 "--resume", launcher=2)
    return result, _resumed_train_records(out, before)


def _assert_follows_reference(train, reference):
    assert [r["step"] for r in train] == [3, 4, 5, 6], "did not resume from step 2"
    np.testing.assert_allclose([r["loss"] for r in train], losses(reference)[2:], rtol=1e-5)


@pytest.mark.slow
def test_train_gpt_tp2_resumes_both_ranks_from_the_step_intact_on_both(text, reference,
                                                                       tmp_path):
    out = tmp_path / "tp2"
    bad_step = step_dir(out, 1, 4)
    result, train = _resume_after_damage(text, out, ["--tp", 2], bad_step, BAD_FILE)
    assert f"{bad_step} is unusable: {BAD_FILE} is bad (SHA-256" in result.stderr, \
        result.stderr[-3000:]
    _assert_follows_reference(train, reference)
    for column in range(2):  # each tensor-parallel rank went on to save step 6
        assert os.path.isdir(step_dir(out, column, 6))


@pytest.mark.slow
def test_train_gpt_pp2_names_the_damaged_piece_it_falls_back_from(text, reference, tmp_path):
    out = tmp_path / "pp2"
    piece = "model.shard.tp0.vs1.safetensors"  # the second stage's: rank 1 wrote it
    bad_step = os.path.join(out, "checkpoints", "ckpt-e000000-s00000004")
    result, train = _resume_after_damage(text, out, ["--pp", 2], bad_step, piece)
    assert f"{bad_step} is unusable: {piece} is bad (SHA-256" in result.stderr, \
        result.stderr[-3000:]
    _assert_follows_reference(train, reference)
