"""``python -m neural_arch.train_gpt`` given what a careless or hostile user gives it: an
``--out-dir`` that is a file or cannot be created, damaged run files and checkpoints, a
checkpoint of another model, non-finite or out-of-range numbers, binary or empty ``--data``,
and a second run into an ``--out-dir`` that a running one holds.

Each is refused as a real process: exit code 2, one line on stderr that names the flag or
file, no traceback, and every file already in ``--out-dir`` left exactly as it was."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launcher_support import free_port
from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

TINY = ["--hidden-size", "32", "--layers", "1", "--attention-heads", "2", "--max-seq-length",
        "8", "--batch-size", "2", "--no-progress", "--log-interval", "1"]
ENV = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
# A run that must train and is then read by its exit code, metrics.jsonl and checkpoints only
# starts as where tensorboardX is not installed (tests/training/without_tensorboardx): its
# torch import was seconds of every such run. Refused runs keep tensorboardX importable, so
# that nothing it would write can slip past the check that --out-dir is left as it was.
LEAN_ENV = dict(os.environ, PYTHONPATH=os.pathsep.join(
    [str(REPO_ROOT / "tests" / "training" / "without_tensorboardx"), str(REPO_ROOT)]))
LOCK_FILE = "train.lock"  # docs/training.md: what a running run holds in --out-dir
CHECKPOINT = "ckpt-e000000-s00000002"
STEPS = 2000  # of the run that holds --out-dir while another tries it: several seconds


def run(*args, timeout=60, launcher=0, tensorboard=True):
    prefix = [sys.executable, "-m", "neural_arch.train_gpt"]
    if launcher:
        prefix = [sys.executable, "-m", "neural_arch.distributed.launcher",
                  f"--nproc_per_node={launcher}", f"--master_port={free_port()}", "-m",
                  "neural_arch.train_gpt"]
    return subprocess.run(prefix + [str(a) for a in args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO_ROOT, env=ENV if tensorboard else LEAN_ENV)


def snapshot(path) -> object:
    """What is at ``path``: None, a file's SHA-256, or a folder's {relative path: hash}."""
    path = Path(path)
    if not path.exists():
        return None
    if path.is_file():
        return hashlib.sha256(path.read_bytes()).hexdigest()
    return {str(p.relative_to(path)): snapshot(p) if p.is_file() else "folder"
            for p in sorted(path.rglob("*"))}


def refused(args, watched, *names, launcher=0) -> str:
    """Run the program with ``args`` (under the launcher with ``launcher`` ranks if given): it
    must exit 2 with one line (each rank one) that holds every one of ``names`` and leave
    ``watched`` (a path) as it was; returns the line."""
    before = snapshot(watched)
    result = run(*args, launcher=launcher)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, (result.returncode, result.stdout[-1500:],
                                    result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    if launcher:  # the launcher's own lines, and one from each rank: "[rank r] ...: error: ..."
        lines = [line for line in lines if ": error: " in line]
        assert sorted(line.split("]")[0] for line in lines) == [
            f"[rank {rank}" for rank in range(launcher)], result.stderr[-3000:]
    else:
        assert len(lines) == 1, result.stderr[-3000:]
    for line in lines:
        for name in names:
            assert str(name) in line, (name, line)
    assert snapshot(watched) == before, f"{watched} was changed"
    return lines[0]


@pytest.fixture(scope="module")
def text(tmp_path_factory) -> str:
    words = "the model reads a small text and learns its letters".split()
    path = tmp_path_factory.mktemp("data") / "text.txt"
    path.write_text(" ".join(words[(i * 7) % len(words)] for i in range(80)) + "\n")
    return str(path)


@pytest.fixture(scope="module")
def trained(text, tmp_path_factory) -> Path:
    """A finished two-step run of the tiny model (width 32) with one checkpoint."""
    out = tmp_path_factory.mktemp("runs") / "trained"
    result = run("--data", text, *TINY, "--max-steps", 2, "--out-dir", out, tensorboard=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert (out / "checkpoints" / CHECKPOINT).is_dir()
    return out


@pytest.fixture
def copy(trained, tmp_path) -> Path:
    """A copy of the trained run, free to damage."""
    return Path(shutil.copytree(trained, tmp_path / "copy"))


# ----- --out-dir ------------------------------------------------------------------------------
def test_out_dir_that_is_a_file(text, tmp_path):
    target = tmp_path / "a_file"
    target.write_text("mine\n")
    refused(["--data", text, *TINY, "--max-steps", 1, "--out-dir", target], target,
            "--out-dir", target, "not a directory")


def test_out_dir_that_cannot_be_created(text, tmp_path):
    parent = tmp_path / "a_file"
    parent.write_text("mine\n")
    refused(["--data", text, *TINY, "--max-steps", 1, "--out-dir", parent / "run"], parent,
            "--out-dir", parent / "run", "cannot be created")


# ----- what --resume and --sample read --------------------------------------------------------
def test_resume_whose_only_checkpoint_is_corrupt(text, copy):
    weights = copy / "checkpoints" / CHECKPOINT / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0xFF
    weights.write_bytes(bytes(data))
    refused(["--data", text, *TINY, "--max-steps", 3, "--out-dir", copy, "--resume"], copy,
            "--resume", weights, "SHA-256")


@pytest.mark.parametrize("damage", ["truncated", "not a run"])
@pytest.mark.parametrize("mode", ["--resume", "--sample"])
@pytest.mark.parametrize("name", ["tokenizer.json", "run.json"])
def test_damaged_run_file(text, copy, name, mode, damage):
    path = copy / name
    content = path.read_text()
    path.write_text(content[:len(content) // 2] if damage == "truncated" else '["a", "list"]')
    flags = ["--sample", 5] if mode == "--sample" else [
        "--data", text, *TINY, "--max-steps", 3, "--resume"]
    refused([*flags, "--out-dir", copy], copy, mode, path)


def _edit_width(run_file: Path, width: int) -> None:
    run = json.loads(run_file.read_text())
    run["model"]["n_embd"] = width
    run_file.write_text(json.dumps(run))


@pytest.mark.parametrize("run_file", ["removed", "edited"])
def test_resume_with_a_checkpoint_of_another_width(text, copy, run_file):
    if run_file == "removed":
        (copy / "run.json").unlink()
    else:  # run.json now agrees with the flags; the checkpoint does not
        _edit_width(copy / "run.json", 64)
    flags = [*TINY, "--hidden-size", "64"]  # the last --hidden-size counts
    refused(["--data", text, *flags, "--max-steps", 3, "--out-dir", copy, "--resume"], copy,
            "--resume", copy / "checkpoints", "(16, 32)", "(16, 64)")


@pytest.mark.slow
def test_pipeline_resume_with_a_checkpoint_of_another_width(text, tmp_path):
    out = tmp_path / "pp2"
    flags = ["--data", text, *TINY, "--layers", 2, "--pp", 2, "--out-dir", out]
    trained = run(*flags, "--max-steps", 2, launcher=2, tensorboard=False)
    assert trained.returncode == 0, trained.stderr[-3000:]
    (out / "run.json").unlink()
    refused([*flags, "--hidden-size", 64, "--max-steps", 3, "--resume"], out, "--resume",
            launcher=2)


def test_sample_with_a_checkpoint_of_another_width(copy):
    _edit_width(copy / "run.json", 64)
    refused(["--sample", 5, "--out-dir", copy], copy, "--sample", "(16, 32)", "(16, 64)")


def test_resume_without_a_checkpoint_warns_once_and_trains(text, tmp_path):
    out = tmp_path / "fresh"
    result = run("--data", text, *TINY, "--max-steps", 1, "--out-dir", out, "--resume",
                 tensorboard=False)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.strip().splitlines() == [
        f"python -m neural_arch.train_gpt: warning: --resume: no checkpoint in "
        f"{out / 'checkpoints'}; starting from step 0"]
    assert '"step": 1' in (out / "metrics.jsonl").read_text()


# ----- numbers and data that make no sense ----------------------------------------------------
@pytest.mark.parametrize("flag,value", [
    ("--learning-rate", "nan"), ("--learning-rate", "inf"), ("--learning-rate", "0"),
    ("--learning-rate", "-0.001"), ("--weight-decay", "nan"), ("--weight-decay", "-0.1"),
    ("--gradient-clip-norm", "nan"), ("--gradient-clip-norm", "inf"), ("--dropout", "1"),
    ("--dropout", "nan"), ("--dropout", "-0.1"), ("--warmup-steps", "-1"),
    ("--temperature", "inf"), ("--top-k", "0"),
])
def test_meaningless_numbers_are_refused_before_the_data_is_read(tmp_path, flag, value):
    # the data is binary: were the flag checked after the data, the line would be the data's
    data = tmp_path / "binary.dat"
    data.write_bytes(bytes(range(256)) * 2)
    out = tmp_path / "out"
    refused(["--data", data, *TINY, "--max-steps", 1, "--out-dir", out, flag, value], out,
            f"{flag} must be", value)
    assert not out.exists()


@pytest.mark.parametrize("content,words", [
    (b"the model reads " * 20 + b"\xff\xfe" + b" text" * 40, ["not UTF-8", "offset 320"]),
    (b"the model reads " * 20 + b"\x00" + b" text" * 40, ["NUL", "offset 320"]),
    (b"", ["is empty"]),
])
def test_data_that_is_not_text(tmp_path, content, words):
    data = tmp_path / "data.txt"
    data.write_bytes(content)
    out = tmp_path / "out"
    out.mkdir()
    refused(["--data", data, *TINY, "--max-steps", 1, "--out-dir", out], out,
            "--data", data, *words)


# ----- one run per --out-dir ------------------------------------------------------------------
_HOLDER = """
import fcntl, json, os, socket, sys, time
handle = open(sys.argv[1], "a+")
fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
handle.truncate(0)
handle.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid()}))
handle.flush()
print("held", flush=True)
time.sleep(120)
"""


def test_a_held_out_dir_refuses_a_second_run_until_its_holder_dies(text, trained, tmp_path):
    out = Path(shutil.copytree(trained, tmp_path / "held"))
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER, str(out / LOCK_FILE)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        flags = ["--data", text, *TINY, "--max-steps", 3, "--out-dir", out, "--resume"]
        refused(flags, out, "--out-dir", out, f"pid {holder.pid}",
                f"host {socket.gethostname()}")
        # every rank of a refused job exits 2: none waits for a rank that already left
        refused(flags, out, f"pid {holder.pid}", launcher=2)
        sample = run("--sample", 5, "--out-dir", out)  # reading needs no lock
        assert sample.returncode == 0 and len(sample.stdout) > 5, sample.stderr[-3000:]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
    assert (out / LOCK_FILE).exists()  # the dead holder's lock file stays behind ...
    result = run(*flags, tensorboard=False)  # ... and does not block
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"step": 3' in (out / "metrics.jsonl").read_text()
    assert not (out / LOCK_FILE).exists()


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_runs_at_once_one_is_refused_the_other_finishes_whole(text, tmp_path):
    out = tmp_path / "shared"
    flags = ["--data", text, *TINY, "--out-dir", out, "--save-interval", 50, "--epochs", 100,
             "--max-steps", STEPS]
    first = subprocess.Popen([sys.executable, "-m", "neural_arch.train_gpt", *map(str, flags)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                             cwd=REPO_ROOT, env=LEAN_ENV)
    try:
        deadline = time.monotonic() + 60
        while first.poll() is None and time.monotonic() < deadline and not (
                (out / "metrics.jsonl").exists()):
            time.sleep(0.05)
        second = run(*flags)
        first_ran_on = first.poll() is None
        stderr = first.communicate(timeout=90)[1]
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first_ran_on, "the first run ended before the second one started: give it more steps"
    assert second.returncode == 2, second.stderr[-3000:]
    assert f"pid {first.pid}" in second.stderr and "Traceback" not in second.stderr
    assert first.returncode == 0, stderr[-3000:]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    steps = [record["step"] for record in records if record["kind"] == "train"]
    assert steps == list(range(1, STEPS + 1))
