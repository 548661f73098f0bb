"""What ``python -m neural_arch.train_gpt`` tells its user, and what it starts itself, in real
processes: the checkpoint a ``--resume`` continues from, validation accuracy under ``--tp``,
the backend ``--backend gloo`` stands for, and ``--world-size N`` without ``--rank`` starting
its own N ranks through the launcher.

The runs train the tiny GPT of ``train_gpt_support`` on its generated text for a few steps."""
import functools
import os
import re

import numpy as np
import pytest

from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test
import train_gpt_support
from train_gpt_support import MODEL, losses, records, write_text

pytestmark = pytest.mark.timeout(120)
# The runs are checked by their output and metrics.jsonl: without tensorboardX (and the torch
# it imports, seconds of rank 0's start-up)
run = functools.partial(train_gpt_support.run, tensorboard=False)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("data") / "text.txt")


def val_accuracies(out_dir):
    return [r["val_accuracy"] for r in records(out_dir) if r["kind"] == "val"]


def test_resume_names_the_checkpoint_and_the_step_it_continues_from(text, tmp_path):
    out = tmp_path / "run"
    fresh = run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 3, "--out-dir", out,
                "--resume")
    assert "resumed from" not in fresh.stdout and "no checkpoint in" in fresh.stderr
    resumed = run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 4, "--out-dir", out,
                  "--resume")
    checkpoint = out / "checkpoints" / "ckpt-e000000-s00000003"
    lines = [line for line in resumed.stdout.splitlines() if line.startswith("resumed from")]
    assert lines == [f"resumed from {checkpoint} (step 3, epoch 1)"], resumed.stdout


@pytest.mark.slow
def test_tensor_parallel_reports_the_same_val_accuracy_as_one_process(text, tmp_path):
    steps = ["--batch-size", 8, "--max-steps", 3]  # one validation, at step 3
    run("--data", text, *MODEL, *steps, "--out-dir", tmp_path / "one")
    result = run("--data", text, *MODEL, *steps, "--out-dir", tmp_path / "tp2", "--tp", 2,
                 launcher=2)
    expected = val_accuracies(tmp_path / "one")
    assert len(expected) == 1 and 0 < expected[0] < 1
    got = val_accuracies(tmp_path / "tp2")
    assert got[0] is not None, got
    np.testing.assert_allclose(got, expected, atol=1e-6)
    assert re.search(r"val_acc \d\.\d{4}", result.stdout), result.stdout


def test_backend_gloo_says_which_backend_it_became(text, tmp_path):
    result = run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 1,
                 "--out-dir", tmp_path, "--backend", "gloo")
    lines = [line for line in result.stdout.splitlines() if line.startswith("--backend")]
    assert lines == ["--backend gloo: torch's CPU backend; here that is shm (chosen "
                     "automatically)"], result.stdout


@pytest.mark.slow
def test_world_size_without_rank_starts_its_own_ranks(text, tmp_path):
    flags = ["--data", text, *MODEL, "--batch-size", 4, "--max-steps", 3]
    # --master-port and --backend are the launcher's option names too: they must reach the
    # ranks, not the launcher
    result = run(*flags, "--out-dir", tmp_path / "self", "--world-size", 2,
                 "--master-port", 1, "--backend", "gloo")
    assert "2 data-parallel" in result.stdout and "--backend gloo" in result.stdout, \
        result.stdout
    run(*flags, "--out-dir", tmp_path / "launched", launcher=2)
    np.testing.assert_allclose(losses(tmp_path / "self"), losses(tmp_path / "launched"),
                               rtol=1e-6)
    assert len(losses(tmp_path / "self")) == 3


def test_a_failing_self_launched_rank_passes_its_exit_code_through(text, tmp_path):
    # the ranks find the mistake once the job is joined (the text is read there), and exit 2
    result = run("--data", text, *MODEL, "--out-dir", tmp_path, "--world-size", 2,
                 "--vocab-size", 8, expect=2)
    assert "--vocab-size 8 is smaller than the char tokenizer's" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    assert not os.path.exists(tmp_path / "metrics.jsonl")
