"""``python -m neural_arch.distributed.env`` says what a process would be in a job and which
variables decided it; ``--json`` prints the same as JSON; an inconsistent environment is an
error naming the variables, exit status 1."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

SRUN = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1", "SLURM_JOB_ID": "4242",
        "SLURM_STEP_ID": "0", "SLURM_NODELIST": "gpu[07-08]", "SLURM_TASKS_PER_NODE": "2"}


def run_env_command(extra, *args, home):
    # Only what the test gives: none of this machine's own launcher variables leak in.
    env = {"PATH": os.environ.get("PATH", ""), "HOME": str(home), "PYTHONPATH": str(REPO_ROOT),
           **extra}
    return subprocess.run([sys.executable, "-m", "neural_arch.distributed.env", *args],
                          env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=90)


def test_text_report_names_the_deciding_variables(tmp_path):
    result = run_env_command(SRUN, home=tmp_path)
    assert result.returncode == 0, result.stderr
    def line(label):
        return next(text for text in result.stdout.splitlines() if text.startswith(label))

    assert "slurm" in line("decided by:")
    assert line("rank ").split()[1] == "1" and "from SLURM_PROCID=1" in line("rank ")
    assert "from SLURM_NTASKS=2" in line("world size")
    assert "gpu07" in line("master address")
    assert "from SLURM_NODELIST=gpu[07-08] (its first host)" in line("master address")
    assert "from SLURM_JOB_ID=4242, SLURM_STEP_ID=0" in line("master port")
    assert line("job ").split()[1] == "slurm:4242.0"
    assert not (tmp_path / ".neural_arch").exists()  # a report creates no secret file


def test_json_report_parses(tmp_path):
    env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400",
           "GROUP_RANK": "0", "NEURAL_ARCH_RUN_ID": "abc123"}
    result = run_env_command(env, "--json", home=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["family"] == "env"
    assert report["values"] == {"rank": 1, "world_size": 2, "local_rank": 1,
                                "local_world_size": 2, "master_addr": "10.0.0.1",
                                "master_port": 29400, "job": "run:abc123"}
    assert report["sources"]["rank"] == "RANK=1"
    assert report["sources"]["master_port"] == "MASTER_PORT=29400"
    assert report["sources"]["job"] == "NEURAL_ARCH_RUN_ID=abc123"


def test_contradictory_environment_is_an_error_naming_both(tmp_path):
    env = {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
           "OMPI_COMM_WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    result = run_env_command(env, "--json", home=tmp_path)
    assert result.returncode == 1
    assert "RANK=1 contradicts OMPI_COMM_WORLD_RANK=0" in json.loads(result.stdout)["error"]
    assert "RANK=1 contradicts OMPI_COMM_WORLD_RANK=0" in result.stderr
