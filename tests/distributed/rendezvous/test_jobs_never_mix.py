"""Two jobs on one host never mix their ranks.

Ranks are started as srun starts them (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_JOB_ID,
SLURM_STEP_ID, SLURM_NODELIST; no MASTER_*), each a plain process calling init_process_group
and an all_reduce of ``10 * job + rank``. Both jobs share one home and so one per-user secret
file: nothing but their identity tells them apart. Two jobs at once each get their own result;
a rank sent to the other job's store fails at once with an error naming both jobs.
"""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
import textwrap

import pytest

from neural_arch.distributed.rendezvous.env import slurm_port
from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(240)

WORKER = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    import neural_arch.distributed as dist

    dist.init_process_group(timeout=float(sys.argv[2]))
    job, rank = int(os.environ["SLURM_JOB_ID"]), dist.get_rank()
    total = np.array([10 * job + rank], dtype=np.int64)
    dist.all_reduce(total)
    with open(sys.argv[1], "w") as out:
        json.dump({"job": job, "rank": rank, "world": dist.get_world_size(),
                   "sum": int(total[0])}, out)
    dist.destroy_process_group()
""")


def port_is_free(port):
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def two_job_ids():
    """Two SLURM job ids whose own ports are free on this host now."""
    rng = random.Random()
    while True:
        first = rng.randrange(1000, 9000)
        ids = (first, first + 1)
        if all(port_is_free(slurm_port({"SLURM_JOB_ID": str(j), "SLURM_STEP_ID": "0"}))
               for j in ids):
            return ids


def start_rank(tmp_path, job, rank, timeout=60.0, **extra):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(tmp_path / "home"),
           "PYTHONPATH": str(REPO_ROOT), "OMP_NUM_THREADS": "1",
           "SLURM_JOB_ID": str(job), "SLURM_STEP_ID": "0", "SLURM_PROCID": str(rank),
           "SLURM_LOCALID": str(rank), "SLURM_NTASKS": "2", "SLURM_NODEID": "0",
           "SLURM_TASKS_PER_NODE": "2", "SLURM_NODELIST": "localhost", **extra}
    out = tmp_path / f"result_{job}_{rank}.json"
    proc = subprocess.Popen([sys.executable, str(script), str(out), str(timeout)], env=env,
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    return proc, out


def finish(proc, limit=150):
    try:
        out, err = proc.communicate(timeout=limit)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        pytest.fail(f"rank still running after {limit} s:\n{err}")
    return proc.returncode, err


@pytest.fixture
def procs():
    started = []
    yield started
    for proc in started:  # whatever a failed assertion left running
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_two_srun_jobs_on_one_host_each_compute_with_their_own_ranks(tmp_path, procs):
    jobs = two_job_ids()
    started = {(job, rank): start_rank(tmp_path, job, rank) for job in jobs for rank in (0, 1)}
    procs.extend(proc for proc, _ in started.values())
    for (job, rank), (proc, out) in started.items():
        code, err = finish(proc)
        assert code == 0, f"job {job} rank {rank}:\n{err}"
    for (job, rank), (_, out) in started.items():
        result = json.loads(out.read_text())
        assert result == {"job": job, "rank": rank, "world": 2, "sum": 20 * job + 1}


@pytest.mark.parametrize("secrets", [{}, {"other": "b" * 32, "own": "a" * 32}],
                         ids=["same secret file", "different secrets"])
def test_a_rank_sent_to_another_jobs_store_fails_at_once_naming_both(tmp_path, procs, secrets):
    job_a, job_b = two_job_ids()
    port = str(slurm_port({"SLURM_JOB_ID": str(job_a), "SLURM_STEP_ID": "0"}))
    a_env = {"MASTER_PORT": port}
    b_env = {"MASTER_PORT": port}
    if secrets:
        a_env["NEURAL_ARCH_SECRET"], b_env["NEURAL_ARCH_SECRET"] = secrets["other"], secrets["own"]
    # Job A's rank 0 serves its store and waits for a rank 1 of its own; job B's rank 1 gets
    # there instead. Without job identities it would have joined job A.
    rank0_a, _ = start_rank(tmp_path, job_a, 0, timeout=120.0, **a_env)
    procs.append(rank0_a)
    rank1_b, out = start_rank(tmp_path, job_b, 1, timeout=60.0, **b_env)
    procs.append(rank1_b)
    code, err = finish(rank1_b, limit=100)
    assert code != 0 and not out.exists()
    assert f"rank 1 of job 'slurm:{job_b}.0' reached" in err, err
    assert f"job 'slurm:{job_a}.0' at localhost:{port}" in err, err
    assert rank0_a.poll() is None  # job A is unharmed, still waiting for its own rank 1
