"""The SLURM recipes run on a real (one-node) SLURM: each test submits a file of
``recipes/slurm/`` with sbatch, as a cluster user would, waits for the job, and checks what its
ranks wrote: the all-reduced sum of the ranks, DDP's parameters against one process trained on
the whole batch, and where each rank's place in the job came from.

The cluster (``slurm_cluster``) is started once for this file and stopped after it, even when
a test fails. Without SLURM installed the tests skip, naming what is missing.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from ddp_cases import train_reference
from dist_harness import mpi_available
from repo_paths import REPO_ROOT, TESTS_DIR
from slurm_cluster import SlurmCluster, missing

from neural_arch.distributed.rendezvous.env import slurm_port

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))

RECIPES = REPO_ROOT / "recipes" / "slurm"
JOB = TESTS_DIR / "slurm_training_job.py"
WORLD = 2


@pytest.fixture(scope="module")
def cluster():
    # Not pytest's tmp_path: munged wants every folder above its socket open to everyone.
    folder = Path(tempfile.mkdtemp(prefix="neural-forge-slurm-"))
    try:
        cluster = SlurmCluster.start(folder)
        try:
            yield cluster
        finally:
            cluster.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run_recipe(cluster, recipe: str, out: Path, *options: str, **env: str) -> list[dict]:
    """Submit ``recipes/slurm/<recipe>`` running the training job, as a user would from the
    repository; return each rank's record, checking the job left no process or segment."""
    out.mkdir()
    before = set(_segments())
    log = cluster.submit(RECIPES / recipe, out / "job.out", *options, cwd=REPO_ROOT,
                         env={"TRAIN_SCRIPT": str(JOB), "TRAIN_ARGS": str(out), **env})
    records = []
    for rank in range(WORLD):
        path = out / f"rank{rank}.npz"
        assert path.exists(), f"rank {rank} wrote nothing; the job's output:\n{log}"
        with np.load(path) as f:
            records.append({k: f[k] for k in f.files})
    assert _processes_of(out) == [], "the job's processes outlived it"
    left = [s for s in set(_segments()) - before if not _alive(int(s.split("_")[1]))]
    assert left == [], f"the job left shared-memory segments: {left}"
    return records


def check_training(records: list[dict]) -> None:
    """Every rank saw the whole world, the sum of the ranks, and the parameters of one process
    trained on every rank's rows together."""
    assert sorted(int(r["rank"]) for r in records) == list(range(WORLD))
    for r in records:
        assert int(r["world"]) == WORLD
        assert float(r["total"][0]) == sum(range(WORLD))
    params = [[r[f"arr_{i}"] for i in range(sum(k.startswith("arr_") for k in r))]
              for r in records]
    for other in params[1:]:
        assert [p.tobytes() for p in other] == [p.tobytes() for p in params[0]]
    reference = train_reference(WORLD, "sgd")
    assert len(params[0]) == len(reference)
    for got, want in zip(params[0], reference):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_srun_starts_one_rank_per_task(cluster, tmp_path, backend):
    records = run_recipe(cluster, "srun.sbatch", tmp_path / "out",
                         NEURAL_ARCH_BACKEND=backend)
    check_training(records)
    for r in records:
        assert (str(r["launcher"]), str(r["backend"])) == ("slurm", backend)
        # no MASTER_PORT in the recipe: the port is the job's own, from its id
        job = {"SLURM_JOB_ID": str(r["job_id"]), "SLURM_STEP_ID": str(r["step_id"])}
        assert str(r["master"]) == f"{cluster.host}:{slurm_port(job)}"


def test_launcher_inside_the_allocation(cluster, tmp_path):
    records = run_recipe(cluster, "launcher.sbatch", tmp_path / "out")
    check_training(records)
    for r in records:
        # the launcher's RANK/WORLD_SIZE decide, not the batch step's SLURM_PROCID=0 of 1
        assert (str(r["launcher"]), str(r["backend"])) == ("env", "shm")


def test_multinode_recipe_on_one_node(cluster, tmp_path):
    # The same file as on N nodes, given one: the node list, the master from scontrol, the
    # per-node launcher under srun, the tcp backend.
    records = run_recipe(cluster, "multinode.sbatch", tmp_path / "out", "--nodes=1",
                         NPROC=str(WORLD))
    check_training(records)
    for r in records:
        assert (str(r["launcher"]), str(r["backend"])) == ("env", "tcp")
        assert str(r["master"]).split(":")[0] == cluster.host


@pytest.mark.parametrize("launch", ["srun --mpi=pmix", "mpirun"])
def test_mpi_ranks_inside_the_allocation(cluster, tmp_path, launch):
    if not mpi_available():
        pytest.skip("the MPI backend needs mpi4py and mpiexec (the mpi extra)")
    why = cluster.pmix_missing() if launch.startswith("srun") else None
    if why:
        pytest.skip(why)
    records = run_recipe(cluster, "mpi.sbatch", tmp_path / "out", MPI_LAUNCH=launch,
                         OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    check_training(records)
    # srun's variables are set for each rank it starts (and decide, agreeing with PMIx);
    # mpirun's ranks inherit only the batch step's, and Open MPI's own decide
    family = "slurm" if launch.startswith("srun") else "mpi"
    for r in records:
        assert (str(r["launcher"]), str(r["backend"])) == (family, "mpi")


def test_env_checker_shows_what_srun_tasks_resolved(cluster, tmp_path):
    # docs/clusters.md's check: each task says what it would be in the job, and from where
    cluster.run("srun", "-n2", "--mpi=none", f"--output={tmp_path}/env-%t.json", "python",
                "-m", "neural_arch.distributed.env", "--json", cwd=REPO_ROOT, timeout=120)
    for task in range(WORLD):
        found = json.loads((tmp_path / f"env-{task}.json").read_text())
        values, sources = found["values"], found["sources"]
        assert found["family"] == "slurm"
        assert (values["rank"], values["world_size"]) == (task, WORLD)
        assert sources["rank"] == f"SLURM_PROCID={task}"
        assert values["master_addr"] == cluster.host
        assert sources["master_port"].endswith("(a port of the job's own)")
        assert values["job"].startswith("slurm:") and values["job"].endswith(".0")


def _segments() -> list[str]:
    try:
        return [n for n in os.listdir("/dev/shm") if n.startswith("nf_")]
    except OSError:
        return []


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _processes_of(out: Path) -> list[str]:
    """Processes whose command line names this job's folder (its ranks, launcher, srun),
    given a moment to finish exiting after sbatch returned."""
    deadline = time.monotonic() + 10.0
    while True:
        found = subprocess.run(["pgrep", "-af", str(out)], capture_output=True, text=True)
        lines = [ln for ln in found.stdout.splitlines() if "pgrep" not in ln]
        if not lines or time.monotonic() > deadline:
            return lines
        time.sleep(0.2)
