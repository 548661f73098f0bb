"""The distributed examples, started the way the README starts them: through the launcher."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(300)


def launch(script, *args, nproc=2):
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone",
           os.path.join(ROOT, "examples", script), f"--nproc_per_node={nproc}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=280, cwd=ROOT)


@pytest.mark.parametrize("backend,nproc,extra", [("shm", 2, []), ("tcp", 3, ["--explicit-sync"])])
def test_train_distributed_reaches_95_percent_with_identical_replicas(backend, nproc, extra):
    result = launch("train_distributed.py", f"--backend={backend}", *(["--"] + extra if extra else []),
                    nproc=nproc)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    match = re.search(r"\[rank 0\] final: test_accuracy=([0-9.]+) world_size=(\d+) backend=(\w+) "
                      r"replicas_agree=(\w+)", result.stdout)
    assert match, result.stdout[-3000:]
    accuracy, world, used_backend, agree = match.groups()
    assert float(accuracy) >= 0.95
    assert int(world) == nproc and used_backend == backend and agree == "True"


def test_quickstart_runs_as_printed_and_learns():
    result = launch("quickstart.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"= ([0-9.]+)$", result.stdout, re.MULTILINE)]
    assert len(losses) == 5, result.stdout
    assert losses[-1] < 0.75 * losses[0], losses
