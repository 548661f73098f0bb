"""``python -m neural_arch.train_gpt`` in real processes: standalone, under the launcher,
seed-style (one command per rank), resume, --sample, --tp 2, and bad flags.

All runs train the same tiny GPT on the same generated text for a few steps with the same
global batch (8 windows of 16 characters), so their per-step losses must agree."""
import functools
import os
import subprocess
import sys

import numpy as np
import pytest

from dist_harness import mpi_available
from gpu_testing import GPUS
from launcher_support import free_port
from mpiexec_launch import run_until_launched
from repo_paths import REPO_ROOT
import train_gpt_support
from train_gpt_support import FIELDS, MODEL, command, losses, records, write_text

pytestmark = pytest.mark.timeout(300)
# The runs are checked by their metrics.jsonl and output: without tensorboardX (and the torch
# it imports), but for the reference, the standalone run that keeps the TensorBoard writer.
run = functools.partial(train_gpt_support.run, tensorboard=False)


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("data") / "text.txt")


@pytest.fixture(scope="module")
def reference(text, tmp_path_factory):
    """Six steps in one process, batch 8."""
    out = tmp_path_factory.mktemp("runs") / "reference"
    result = train_gpt_support.run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6,
                                   "--out-dir", out)
    return str(out), result


def test_standalone_writes_metrics_checkpoints_and_summary(reference):
    out, result = reference
    values, lines = losses(out), records(out)
    assert len(values) == 6 and np.all(np.isfinite(values))
    for record in lines:
        if record["kind"] == "train":
            assert set(record) == FIELDS, record
        else:
            assert record["kind"] == "val" and {"val_loss", "val_accuracy"} <= set(record)
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == [
        "ckpt-e000000-s00000003", "ckpt-e000000-s00000006"]
    assert "done: 6 steps" in result.stdout and "tokens/s" in result.stdout


def test_resume_continues_the_step_count_and_the_loss_curve(text, reference, tmp_path):
    out = tmp_path / "resumed"
    run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 3, "--out-dir", out)
    run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6, "--out-dir", out,
        "--resume")
    np.testing.assert_allclose(losses(out), losses(reference[0]), rtol=1e-6)


def test_launcher_with_two_ranks_matches_one_process(text, reference, tmp_path):
    out = tmp_path / "launched"
    result = run("--data", text, *MODEL, "--batch-size", 4, "--max-steps", 6, "--out-dir", out,
                 launcher=2)
    assert "2 data-parallel" in result.stdout
    np.testing.assert_allclose(losses(out), losses(reference[0]), rtol=1e-5)


def test_one_command_per_rank_matches_one_process(text, reference, tmp_path):
    out, port = tmp_path / "seed_style", free_port()
    procs = [subprocess.Popen(command("--data", text, *MODEL, "--batch-size", 4, "--max-steps",
                                      6, "--out-dir", out, "--world-size", 2, "--rank", rank,
                                      "--master-addr", "127.0.0.1", "--master-port", port),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              cwd=REPO_ROOT, env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)))
             for rank in (1, 0)]
    outputs = [p.communicate(timeout=240)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    np.testing.assert_allclose(losses(out), losses(reference[0]), rtol=1e-5)


@pytest.mark.skipif(not mpi_available(), reason="needs mpi4py and mpiexec")
def test_mpirun_with_two_ranks_matches_one_process(text, reference, tmp_path):
    out = tmp_path / "mpi"
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(PYTHONPATH=str(REPO_ROOT), OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_rmaps_base_oversubscribe="1")
    cmd = ["mpiexec", "-n", "2", sys.executable, "-m", "neural_arch.train_gpt", "--data", text,
           *MODEL, "--batch-size", "4", "--max-steps", "6", "--out-dir", str(out)]
    result = run_until_launched(
        lambda: subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO_ROOT,
                               env=env),
        output_of=lambda result: result.stdout + result.stderr)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "2 data-parallel" in result.stdout
    np.testing.assert_allclose(losses(out), losses(reference[0]), rtol=1e-5)


@pytest.mark.parametrize("stage", [1, 3])
def test_zero_stages_at_two_ranks_match_one_process(text, reference, tmp_path, stage):
    out = tmp_path / f"zero{stage}"
    run("--data", text, *MODEL, "--batch-size", 4, "--max-steps", 6, "--out-dir", out,
        "--zero-stage", stage, launcher=2)
    np.testing.assert_allclose(losses(out), losses(reference[0]), rtol=1e-5)
    if stage == 3:  # the parameters really were sharded: each rank saved its own shard
        saved = os.listdir(os.path.join(out, "checkpoints", "ckpt-e000000-s00000006"))
        assert {"model.shard0.safetensors", "model.shard1.safetensors"} <= set(saved), saved


def test_mixed_precision_follows_the_float32_run(text, reference, tmp_path):
    out = tmp_path / "fp16"
    run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6, "--out-dir", out,
        "--mixed-precision")
    half, full = losses(out), losses(reference[0])
    np.testing.assert_allclose(half, full, rtol=2e-2)
    assert not np.array_equal(half, full)  # float16 rounding shows: it did compute in float16


def test_tensor_parallel_two_ranks_match_one_process(text, reference, tmp_path):
    out = tmp_path / "tp2"
    result = run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6, "--out-dir", out,
                 "--tp", 2, launcher=2)
    assert "1 data-parallel x 2 tensor-parallel" in result.stdout
    np.testing.assert_allclose(losses(out), losses(reference[0]), rtol=1e-5)


def test_tensor_parallel_clips_by_the_whole_models_norm(text, tmp_path):
    clip = ["--gradient-clip-norm", "0.05"]  # below every step's norm: each step clips
    run("--data", text, *MODEL, *clip, "--batch-size", 8, "--max-steps", 4,
        "--out-dir", tmp_path / "one")
    assert losses(tmp_path / "one", "grad_norm").min() > 0.05 * 4
    run("--data", text, *MODEL, *clip, "--batch-size", 8, "--max-steps", 4,
        "--out-dir", tmp_path / "tp2", "--tp", 2, launcher=2)
    for key in ("loss", "grad_norm"):
        np.testing.assert_allclose(losses(tmp_path / "tp2", key), losses(tmp_path / "one", key),
                                   rtol=1e-4, err_msg=key)


def test_sample_prints_text_from_the_latest_checkpoint(reference):
    result = run("--out-dir", reference[0], "--sample", 40, "--prompt", "the ")
    text = result.stdout.rstrip("\n")
    assert text.startswith("the ") and len(text) == 44


@pytest.mark.parametrize("flags,message", [
    (["--hidden-size", "30", "--attention-heads", "4"], "not divisible by --attention-heads"),
    (["--data", "missing.txt"], "missing.txt: no such file"),
    (["--tp", "3"], "--tp 3 does not divide --attention-heads 4"),
    (["--pp", "2", "--zero-stage", "3"], "--zero-stage 3 is not supported together with --pp 2"),
    (["--batch-size", "0"], "--batch-size must be a positive integer"),
    (["--no-such-flag"], "unrecognized arguments"),
    (["--device", "tpu"], "--device must be cpu, cuda or cuda:N, got 'tpu'"),
    (["--device", "cuda", "--pp", "2"], "--pp 2 is not supported together with --device cuda"),
    (["--device", "cuda:0", "--zero-stage", "2"],
     "--zero-stage 2 is not supported together with --device cuda:0"),
    (["--device", "cuda", "--mixed-precision"],
     "--mixed-precision is not supported together with --device cuda"),
])
def test_bad_flags_exit_2_with_one_line(text, flags, message, tmp_path):
    # --out-dir: were a check missing, the run would train into tmp_path, not the repository
    args = (["--data", text] if "--data" not in flags else []) + flags + [
        "--out-dir", str(tmp_path), "--max-steps", "1"]
    result = run(*args, expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr and result.stdout == ""


@pytest.mark.skipif(GPUS > 0, reason="a GPU is here: --device cuda trains (test_train_gpt_gpu)")
def test_device_cuda_without_a_gpu_exits_2_with_the_reason(text, tmp_path):
    result = run("--data", text, "--device", "cuda", "--out-dir", tmp_path, "--max-steps", 1,
                 expect=2)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda: device 'cuda' is not available" in lines[0], \
        result.stderr
