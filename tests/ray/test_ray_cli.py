"""``python -m neural_arch.cli train --script S --nproc 2 --backend ray``: the script runs as the
training loop of each of 2 Ray workers (its sys.argv set), on a Ray started for the command (one
node: shared memory) or on a running cluster named by ``--address`` (two nodes: tcp); every
worker sees the job (its all-reduce equals the NumPy sum). Nothing is left behind."""
from __future__ import annotations

import pytest

from conftest import run_cli
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

pytest.importorskip("ray")
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_the_script_runs_in_each_worker_of_an_embedded_ray(tmp_path):
    records, script, _ = run_cli(tmp_path)
    assert [r["backend"] for r in records] == ["shm", "shm"]  # one node
    assert [r["argv"][0] for r in records] == [script, script]
    assert list((tmp_path / "runs").iterdir())  # the run's folder


def test_address_runs_the_script_on_a_running_cluster(ray_cluster, tmp_path):
    _, address = ray_cluster
    records, script, _ = run_cli(tmp_path, "--address", address)
    assert [(r["backend"], r["node"]) for r in records] == [("tcp", 0), ("tcp", 1)]
    assert [r["argv"][0] for r in records] == [script, script]
