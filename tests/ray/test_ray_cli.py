"""``python -m neural_arch.cli train --script S --nproc 2 --backend ray``: the script runs as the
training loop of each of 2 Ray workers (its sys.argv set), on a Ray started for the command (one
node: shared memory) or on a running cluster named by ``--address`` (two nodes: tcp); every
worker sees the job (its all-reduce equals the NumPy sum). Nothing is left behind."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import ray_env
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

pytest.importorskip("ray")
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

SCRIPT = """\
import json, os, sys
import numpy as np
import neural_arch.distributed as dist
from neural_arch.ray import get_context
dist.init_process_group()
x = np.array([float(dist.get_rank() + 1)])
dist.all_reduce(x)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"world": dist.get_world_size(), "sum": float(x[0]), "argv": sys.argv,
               "backend": dist.get_backend(), "node": get_context().get_node_rank(),
               "main": __name__}, f)
dist.destroy_process_group()
"""


def run_cli(tmp_path, *extra):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "out"
    out.mkdir()
    env = ray_env()
    env["HOME"] = str(tmp_path)  # the run's folder goes under ~/ray_results
    done = subprocess.run([sys.executable, "-m", "neural_arch.cli", "train", "--script",
                           str(script), "--nproc", "2", "--backend", "ray", *extra, "--",
                           str(out), "--lr", "0.1"], env=env, capture_output=True, text=True,
                          timeout=100, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for record in records:
        assert record["world"] == 2 and record["sum"] == 3.0, records
        assert record["argv"] == [str(script), str(out), "--lr", "0.1"], record
        assert record["main"] == "__main__"
    return records


def test_the_script_runs_in_each_worker_of_an_embedded_ray(tmp_path):
    records = run_cli(tmp_path)
    assert [r["backend"] for r in records] == ["shm", "shm"]  # one node
    assert list((tmp_path / "ray_results").iterdir())  # the run's folder


def test_address_runs_the_script_on_a_running_cluster(ray_cluster, tmp_path):
    _, address = ray_cluster
    records = run_cli(tmp_path, "--address", address)
    assert [(r["backend"], r["node"]) for r in records] == [("tcp", 0), ("tcp", 1)]
