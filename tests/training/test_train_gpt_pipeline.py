"""``python -m neural_arch.train_gpt --pp N`` in real processes: a GPT3D on a (dp, tp, pp) mesh
follows the one-process run of the same global batch, resumes, samples, and refuses what it
cannot do.

Every run trains the same tiny GPT on the same generated text with the same global batch (8
windows of 16 characters) as the one-process reference, so their per-step training losses and
their validation losses must agree to float rounding."""
import functools
import json
import os

import numpy as np
import pytest

import train_gpt_support
from train_gpt_support import FIELDS, MODEL, losses, records, write_text

# The runs are checked by their metrics.jsonl and output: without tensorboardX (and the torch
# it imports), but for two_stages, a pipeline run that keeps the TensorBoard writer.
run = functools.partial(train_gpt_support.run, tensorboard=False)

COSINE = ["--lr-schedule", "cosine", "--warmup-steps", "2", "--learning-rate", "3e-3"]


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("data") / "text.txt")


@pytest.fixture(scope="module")
def reference(text, tmp_path_factory):
    """Six steps in one process, batch 8."""
    out = tmp_path_factory.mktemp("runs") / "reference"
    run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6, "--out-dir", out)
    return str(out)


@pytest.fixture(scope="module")
def two_stages(text, tmp_path_factory):
    """The reference's run as two pipeline stages at two processes."""
    out = tmp_path_factory.mktemp("runs") / "pp2"
    result = train_gpt_support.run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6,
                                   "--out-dir", out, "--pp", 2, launcher=2)
    return str(out), result


CLIP = ["--gradient-clip-norm", "0.05"]  # below every step's norm: each step clips


@pytest.fixture(scope="module")
def clipped_reference(text, tmp_path_factory):
    """The reference's six steps, clipped."""
    out = tmp_path_factory.mktemp("runs") / "clipped"
    run("--data", text, *MODEL, *CLIP, "--batch-size", 8, "--max-steps", 6, "--out-dir", out)
    return str(out)


def assert_follows(out, reference):
    np.testing.assert_allclose(losses(out), losses(reference), rtol=1e-5)
    # the norm of the whole model's gradient (every stage's, every shard's), before clipping
    np.testing.assert_allclose(losses(out, "grad_norm"), losses(reference, "grad_norm"),
                               rtol=1e-4)
    np.testing.assert_allclose(losses(out, "val_loss"), losses(reference, "val_loss"),
                               rtol=1e-5)
    assert len(losses(out)) == 6 and len(losses(out, "val_loss")) == 2


@pytest.mark.timeout(200)
def test_two_stages_match_one_process_and_write_the_trainers_records(reference, two_stages):
    out, result = two_stages
    assert_follows(out, reference)
    assert "1 data-parallel x 1 tensor-parallel x 2 pipeline stages (1f1b, 2 micro-batches)" \
        in result.stdout
    assert "done: 6 steps" in result.stdout and "tokens/s" in result.stdout
    for record in records(out):
        if record["kind"] == "train":
            assert set(record) == FIELDS, record
            assert record["grad_norm"] > 0 and record["tokens_per_second"] > 0
    saved = sorted(os.listdir(os.path.join(out, "checkpoints")))
    assert saved == ["ckpt-e000000-s00000003", "ckpt-e000000-s00000003.loop.json",
                     "ckpt-e000000-s00000006", "ckpt-e000000-s00000006.loop.json"]
    with open(os.path.join(out, "run.json")) as handle:
        assert json.load(handle)["pp"] == 2


@pytest.mark.timeout(200)
@pytest.mark.parametrize("flags,batch", [
    (["--pp", 2, "--tp", 2], 8),                                      # dp 1 x tp 2 x pp 2
    (["--pp", 2, "--zero-stage", 1, "--pp-schedule", "gpipe"], 4),   # dp 2 x tp 1 x pp 2
])
def test_four_processes_match_one_process(text, reference, tmp_path, flags, batch):
    out = tmp_path / "run"
    run("--data", text, *MODEL, "--batch-size", batch, "--max-steps", 6, "--out-dir", out,
        *flags, launcher=4)
    assert_follows(str(out), reference)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_eight_processes_on_a_full_3d_mesh_match_one_process(text, reference, tmp_path):
    # dp 2 x tp 2 x pp 2: every parallelism at once, through the Trainer's pipeline strategy
    out = tmp_path / "run"
    run("--data", text, *MODEL, "--batch-size", 4, "--max-steps", 6, "--out-dir", out,
        "--pp", 2, "--tp", 2, launcher=8)
    assert_follows(str(out), reference)


@pytest.mark.timeout(200)
def test_clipping_on_a_tp_by_pp_mesh_matches_one_process_clipped(text, clipped_reference,
                                                                  tmp_path):
    assert losses(clipped_reference, "grad_norm").min() > 0.05 * 4
    out = tmp_path / "run"
    run("--data", text, *MODEL, *CLIP, "--batch-size", 8, "--max-steps", 6, "--out-dir", out,
        "--pp", 2, "--tp", 2, launcher=4)
    assert_follows(str(out), clipped_reference)


@pytest.mark.timeout(200)
def test_interleaved_schedule_matches_one_process(text, tmp_path):
    deeper = [*MODEL, "--layers", 4, "--batch-size", 8, "--max-steps", 3, *COSINE]
    run("--data", text, *deeper, "--out-dir", tmp_path / "dense")
    run("--data", text, *deeper, "--out-dir", tmp_path / "interleaved", "--pp", 2,
        "--pp-schedule", "interleaved", "--microbatches", 4, launcher=2)
    for key in ("loss", "lr"):
        np.testing.assert_allclose(losses(tmp_path / "interleaved", key),
                                   losses(tmp_path / "dense", key), rtol=1e-5, err_msg=key)


@pytest.mark.timeout(200)
def test_two_epochs_reshuffle_and_end_as_one_process_does(text, tmp_path):
    # 44 training windows: 5 batches of 8 and one of 4, which still splits into 2 micro-batches
    short = [*MODEL, "--val-fraction", "0.85", "--epochs", 2, "--batch-size", 8]
    run("--data", text, *short, "--out-dir", tmp_path / "dense")
    result = run("--data", text, *short, "--out-dir", tmp_path / "pp2", "--pp", 2, launcher=2)
    assert "done: 12 steps, 2 epochs" in result.stdout
    np.testing.assert_allclose(losses(tmp_path / "pp2"), losses(tmp_path / "dense"), rtol=1e-5)
    epochs = [[r for r in records(tmp_path / run_dir) if r["kind"] == "epoch"]
              for run_dir in ("pp2", "dense")]
    assert [r["step"] for r in epochs[0]] == [r["step"] for r in epochs[1]] == [6, 12]
    # every record names its epoch as the Trainer's do (counted from 1, as the console says)
    numbered = [[(r["kind"], r["step"], r["epoch"]) for r in records(tmp_path / run_dir)]
                for run_dir in ("pp2", "dense")]
    assert numbered[0] == numbered[1] and {e for _, _, e in numbered[0]} == {1, 2}, numbered
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose([r[key] for r in epochs[0]], [r[key] for r in epochs[1]],
                                   rtol=1e-5, err_msg=key)


@pytest.mark.timeout(200)
def test_resume_continues_the_step_count_the_loss_and_the_schedule(text, tmp_path):
    reference, out = tmp_path / "reference", tmp_path / "resumed"
    run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6, "--out-dir", reference,
        *COSINE)
    run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 3, "--out-dir", out,
        "--pp", 2, *COSINE, launcher=2)
    result = run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6, "--out-dir", out,
                 "--pp", 2, "--resume", *COSINE, launcher=2)
    assert "train step 3/6" not in result.stdout and "train step 4/6" in result.stdout
    np.testing.assert_allclose(losses(out), losses(reference), rtol=1e-5)
    # the resumed steps' rates are those of the 6-step schedule (the first run's 3-step
    # schedule decayed to 0 at its step 3, as the Trainer's does)
    np.testing.assert_allclose(losses(out, "lr")[3:], losses(reference, "lr")[3:], rtol=1e-9)
    times = [r["time"] for r in records(out) if r["kind"] == "train"]
    assert times == sorted(times)  # the clock continues across the resume


@pytest.mark.timeout(120)
def test_resume_with_another_pipeline_is_refused(text, two_stages):
    result = run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 7, "--out-dir",
                 two_stages[0], "--resume", expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--resume" in lines[0] and "pp 2" in lines[0], result.stderr


@pytest.mark.timeout(120)
def test_sample_from_a_pipeline_run_prints_the_reference_runs_text(reference, two_stages):
    # the same weights (to float rounding), the same seed: the same characters
    sampled = run("--out-dir", two_stages[0], "--sample", 40, "--prompt", "the ").stdout
    assert sampled.startswith("the ") and len(sampled.rstrip("\n")) == 44
    assert sampled == run("--out-dir", reference, "--sample", 40, "--prompt", "the ").stdout


@pytest.mark.timeout(60)
@pytest.mark.parametrize("flags,message", [
    (["--pp", "2", "--zero-stage", "2"], "--zero-stage 2 is not supported together with --pp 2"),
    (["--pp", "2", "--mixed-precision"], "--mixed-precision is not supported together with --pp"),
    (["--pp", "2", "--gradient-accumulation-steps", "2"],
     "--gradient-accumulation-steps 2 is not supported together with --pp 2"),
    (["--pp", "2", "--layers", "1"], "--layers 1 is fewer than the 2 pipeline stages of --pp 2"),
    (["--pp", "2", "--layers", "3", "--pp-schedule", "interleaved"],
     "--layers 3 is fewer than the 4 pipeline stages of --pp 2 x 2 chunks"),
    (["--pp", "2", "--batch-size", "6", "--microbatches", "4"],
     "--microbatches 4 does not divide --batch-size 6"),
    (["--pp", "4", "--batch-size", "6"], "(the default is --pp 4)"),
    (["--pp", "2", "--world-size", "3", "--rank", "0"],
     "--tp 1 x --pp 2 does not divide --world-size 3"),
    (["--microbatches", "2"], "--microbatches applies to pipeline parallelism only"),
    (["--pp-schedule", "gpipe"], "--pp-schedule applies to pipeline parallelism only"),
    (["--pp", "2", "--pp-schedule", "zigzag"], "invalid choice: 'zigzag'"),
])
def test_bad_pipeline_flags_exit_2_with_one_line(text, flags, message, tmp_path):
    result = run("--data", text, *flags, "--out-dir", tmp_path, "--max-steps", 1, expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.timeout(120)
def test_a_world_the_mesh_does_not_divide_exits_2(text, tmp_path):
    result = run("--data", text, *MODEL, "--pp", 4, "--layers", 4, "--batch-size", 4,
                 "--out-dir", tmp_path, launcher=2, expect=2)
    # the launcher may stop the other rank before it says the same
    assert "error: --tp 1 x --pp 4 does not divide the world size 2" in result.stderr, \
        result.stderr
    assert "Traceback" not in result.stderr
