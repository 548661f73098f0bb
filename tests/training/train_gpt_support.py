"""What the tests of ``python -m neural_arch.train_gpt`` share: the tiny model's flags, running
the program (alone or under the launcher), a small generated text and reading metrics.jsonl."""
import json
import os
import subprocess
import sys

import numpy as np

from launcher_support import free_port
from repo_paths import REPO_ROOT

MODEL = ["--hidden-size", "32", "--layers", "2", "--attention-heads", "2",
         "--max-seq-length", "16", "--log-interval", "1", "--no-progress",
         "--gradient-clip-norm", "0", "--eval-interval", "3", "--eval-batches", "2",
         "--save-interval", "3"]
# the fields of a "train" record (comm_seconds and comm_hidden_seconds are null in a
# pipeline run)
FIELDS = {"kind", "step", "epoch", "time", "loss", "lr", "grad_norm", "samples_per_second",
          "tokens_per_second", "comm_seconds", "comm_hidden_seconds"}


def command(*args, launcher=0):
    """The program's command line, under our launcher with ``launcher`` processes if given."""
    if launcher:
        return [sys.executable, "-m", "neural_arch.distributed.launcher",
                f"--nproc_per_node={launcher}", f"--master_port={free_port()}", "-m",
                "neural_arch.train_gpt", *map(str, args)]
    return [sys.executable, "-m", "neural_arch.train_gpt", *map(str, args)]


# tensorboardX imports torch, seconds of rank 0's start-up: a test that reads metrics.jsonl only
# may run without it (TensorBoard's own output is tested in test_plot_metrics)
WITHOUT_TENSORBOARD = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                   "without_tensorboardx")


def run(*args, launcher=0, expect=0, timeout=240, tensorboard=True):
    """Run the program; ``tensorboard=False``: as where tensorboardX is not installed."""
    path = [str(REPO_ROOT)] if tensorboard else [WITHOUT_TENSORBOARD, str(REPO_ROOT)]
    result = subprocess.run(command(*args, launcher=launcher), capture_output=True, text=True,
                            timeout=timeout, cwd=REPO_ROOT,
                            env=dict(os.environ, PYTHONPATH=os.pathsep.join(path)))
    assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-2000:]
    return result


def write_text(path):
    """900 words of a ten-word vocabulary, the same every time; returns the path as str."""
    rng = np.random.default_rng(0)
    words = ["the", "model", "reads", "a", "small", "text", "and", "learns", "its", "letters"]
    path.write_text(" ".join(rng.choice(words, size=900)) + "\n")
    return str(path)


def records(out_dir):
    """Every record of a run's metrics.jsonl; its train records must count every step."""
    with open(os.path.join(out_dir, "metrics.jsonl")) as handle:
        lines = [json.loads(line) for line in handle]
    train = [r for r in lines if r["kind"] == "train"]
    assert [r["step"] for r in train] == list(range(1, len(train) + 1))
    return lines


def losses(out_dir, key="loss"):
    """The train losses of a run, or with ``key="val_loss"`` its validation losses."""
    kind = "val" if key == "val_loss" else "train"
    return np.array([r[key] for r in records(out_dir) if r["kind"] == kind])
