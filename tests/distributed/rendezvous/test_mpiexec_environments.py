"""Jobs started by mpiexec alone: ranks and sizes come from Open MPI's variables, whatever the
backend (auto picks mpi; shm and tcp meet at a store through MASTER_ADDR/MASTER_PORT)."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from dist_harness import free_port, mpi_available
from mpiexec_launch import run_until_launched
from repo_paths import REPO_ROOT as REPO

pytestmark = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec not installed")

JOB = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        assert name not in os.environ, name  # only Open MPI's own variables say who is who
    from neural_arch import distributed as dist
    backend = sys.argv[1]
    dist.init_process_group(backend, timeout=60)
    info = dist.get_distributed_info()
    rank, world = dist.get_rank(), dist.get_world_size()
    x = np.arange(1_000_003, dtype=np.float64) * (rank + 1)
    dist.all_reduce(x)
    ok = bool(np.array_equal(x, np.arange(1_000_003, dtype=np.float64) * world * (world + 1) / 2))
    record = {"rank": rank, "world": world, "local_rank": dist.get_local_rank(),
              "backend": info["backend"], "launcher": info["launcher"], "sum_ok": ok,
              "ompi": [int(os.environ[f"OMPI_COMM_WORLD_{name}"])
                       for name in ("RANK", "SIZE", "LOCAL_RANK")]}
    with open(os.path.join(sys.argv[2], f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()
""")


@pytest.mark.parametrize("requested, expected", [("auto", "mpi"), ("gloo", "mpi"),
                                                 ("shm", "shm"), ("tcp", "tcp")])
def test_ranks_come_from_open_mpi_for_every_backend(tmp_path, requested, expected):
    job, out = tmp_path / "job.py", tmp_path / "out"
    job.write_text(JOB)
    out.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_btl_sm_backing_directory=str(tmp_path),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = ["mpiexec", "-n", "3", "--oversubscribe", "-x", "MASTER_ADDR", "-x", "MASTER_PORT",
           sys.executable, str(job), requested, str(out)]
    proc = run_until_launched(
        lambda: subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                               timeout=180),
        output_of=lambda proc: "" if any(out.iterdir()) else proc.stdout + proc.stderr)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = sorted((json.loads(p.read_text()) for p in out.glob("rank*.json")),
                     key=lambda r: r["rank"])
    assert [r["rank"] for r in records] == [0, 1, 2], records
    for r in records:
        # Open MPI may number local ranks in another order than ranks: follow its word
        assert r["ompi"] == [r["rank"], r["world"], r["local_rank"]] and r["world"] == 3, r
        assert r["backend"] == expected and r["sum_ok"], r
