"""PyTorch's DDP tutorial, ported with import-line and CPU edits only, runs under the launcher
and resumes from its snapshot (examples/ddp_tutorial_port.py)."""
import os
import re
import subprocess
import sys

import numpy as np
import pytest

import neural_arch

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(300)
SCRIPT = REPO_ROOT / "examples" / "ddp_tutorial_port.py"


def launch(cwd, total_epochs, save_every):
    # torchrun's order: launcher options, the script, the script's own arguments
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone",
           "--nproc_per_node=2", "--backend=shm", str(SCRIPT), str(total_epochs),
           str(save_every)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=cwd, env=env)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout


def epochs_run(stdout, rank):
    return [int(e) for e in re.findall(rf"^\[rank {rank}\] \[GPU{rank}\] Epoch (\d+) \| "
                                       rf"Batchsize: 32 \| Steps: 32$", stdout, re.MULTILINE)]


def test_the_ported_tutorial_trains_saves_and_resumes(tmp_path):
    first = launch(tmp_path, total_epochs=2, save_every=1)
    assert epochs_run(first, 0) == [0, 1] and epochs_run(first, 1) == [0, 1], first
    assert "Loading snapshot" not in first
    assert re.search(r"^\[rank 0\] Epoch 1 \| Training snapshot saved at snapshot.pt$", first,
                     re.MULTILINE), first
    saved = neural_arch.load(tmp_path / "snapshot.pt", map_location="cpu")
    assert saved["EPOCHS_RUN"] == 1 and type(saved["EPOCHS_RUN"]) is int
    assert {k: v.shape for k, v in saved["MODEL_STATE"].items()} == {"weight": (1, 20),
                                                                     "bias": (1,)}

    second = launch(tmp_path, total_epochs=3, save_every=1)
    for rank in (0, 1):
        assert f"[rank {rank}] Resuming training from snapshot at Epoch 1" in second, second
        assert epochs_run(second, rank) == [1, 2], second  # the tutorial re-runs the saved epoch
    resumed = neural_arch.load(tmp_path / "snapshot.pt")
    assert resumed["EPOCHS_RUN"] == 2
    # The tutorial's loss, cross_entropy over a single output, is constant (its gradient is
    # zero, in torch too), so the weights the second run saves are exactly those it resumed
    # from; a second run that ignored the snapshot would save its own fresh random weights.
    for key, value in saved["MODEL_STATE"].items():
        np.testing.assert_array_equal(resumed["MODEL_STATE"][key], value)
