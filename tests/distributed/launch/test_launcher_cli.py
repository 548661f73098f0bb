"""The launcher command line end to end: option placement, the environment contract, output,
log files, the master-port check and two simulated nodes. Workers are real processes."""
from __future__ import annotations

import os
import socket
import sys

import pytest

try:
    from launcher_support import CONTRACT, free_port, job  # noqa: F401  (fixture)
except ImportError:  # the tests directory imported as a package
    from tests.launcher_support import CONTRACT, free_port, job  # noqa: F401

pytestmark = pytest.mark.timeout(120)

ENV_WORKER = """
dump_env()
print(f"out {RANK}")
print(f"err {RANK}", file=sys.stderr)
"""


def expected_contract(rank, nproc, nnodes, node_rank, port, backend="auto", restart=0):
    """The environment contract restated from its definition."""
    return {"RANK": str(node_rank * nproc + rank % nproc), "LOCAL_RANK": str(rank % nproc),
            "WORLD_SIZE": str(nnodes * nproc), "LOCAL_WORLD_SIZE": str(nproc),
            "GROUP_RANK": str(node_rank), "NODE_RANK": str(node_rank),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NEURAL_ARCH_BACKEND": backend,
            "RESTART_COUNT": str(restart), "PYTHONUNBUFFERED": "1"}


def test_environment_contract_for_every_rank(job):
    port = free_port()
    script = job.script(ENV_WORKER)
    result = job.run(script, "--nproc_per_node=3", "--master_addr=127.0.0.1",
                     f"--master_port={port}", "--backend=tcp")
    assert result.returncode == 0, result.stderr
    envs = job.envs()
    assert sorted(envs) == [(0, 0), (1, 0), (2, 0)]
    for (rank, _), env in envs.items():
        for key, value in expected_contract(rank, 3, 1, 0, port, backend="tcp").items():
            assert env[key] == value, (rank, key, env[key], value)
        assert env["OMP_NUM_THREADS"] == "1"
    secrets = {env["NEURAL_ARCH_SECRET"] for env in envs.values()}
    assert len(secrets) == 1 and len(secrets.pop()) == 64
    assert "OMP_NUM_THREADS=1" in result.stderr


def test_preset_secret_and_thread_count_are_kept(job):
    script = job.script(ENV_WORKER)
    result = job.run(script, "--nproc_per_node=2", f"--master_port={free_port()}",
                     env=job.env(NEURAL_ARCH_SECRET="shared-by-all-nodes", OMP_NUM_THREADS="3"))
    assert result.returncode == 0, result.stderr
    envs = job.envs()
    assert {env["NEURAL_ARCH_SECRET"] for env in envs.values()} == {"shared-by-all-nodes"}
    assert {env["OMP_NUM_THREADS"] for env in envs.values()} == {"3"}
    assert "OMP_NUM_THREADS=1" not in result.stderr


def test_each_job_gets_a_fresh_secret(job):
    script = job.script("dump_env(tag='env' + sys.argv[1])\n")
    for run in ("1", "2"):
        assert job.run(script, run, f"--master_port={free_port()}").returncode == 0
    first, second = job.envs("env1")[(0, 0)], job.envs("env2")[(0, 0)]
    assert first["NEURAL_ARCH_SECRET"] != second["NEURAL_ARCH_SECRET"]
    assert first["OMP_NUM_THREADS"] is None  # one worker: nothing to oversubscribe


@pytest.mark.parametrize("order", ["options_first", "options_last", "mixed_spellings"])
def test_options_before_or_after_the_script(job, order):
    port = free_port()
    script = job.script(ENV_WORKER)
    args = {
        "options_first": ["--nproc_per_node", "2", f"--master_port={port}", "--backend", "shm",
                          script, "--lr", "0.5", "data.txt"],
        "options_last": [script, "--lr", "0.5", "--nproc_per_node=2", "data.txt",
                         "--master-port", str(port), "--backend=shm"],
        "mixed_spellings": ["--nproc-per-node=2", script, "--lr", "0.5", "--master_port",
                            str(port), "data.txt", "--backend", "shm"],
    }[order]
    result = job.run(*args)
    assert result.returncode == 0, result.stderr
    envs = job.envs()
    assert sorted(envs) == [(0, 0), (1, 0)]
    for (rank, _), env in envs.items():
        assert env["argv"] == ["--lr", "0.5", "data.txt"]
        assert (env["WORLD_SIZE"], env["MASTER_PORT"], env["NEURAL_ARCH_BACKEND"]) == \
            ("2", str(port), "shm")


def test_double_dash_passes_launcher_names_to_the_script(job):
    script = job.script(ENV_WORKER)
    result = job.run(script, "-v", "--nproc_per_node=2", f"--master_port={free_port()}", "--",
                     "--nproc_per_node=7", "--backend", "mpi", "--")
    assert result.returncode == 0, result.stderr
    envs = job.envs()
    assert sorted(envs) == [(0, 0), (1, 0)]
    assert envs[(0, 0)]["argv"] == ["-v", "--nproc_per_node=7", "--backend", "mpi", "--"]
    assert envs[(0, 0)]["NEURAL_ARCH_BACKEND"] == "auto"


def test_module_mode_runs_python_dash_m(job):
    job.script("", name="jobpkg/__init__.py")
    job.script(ENV_WORKER, name="jobpkg/train.py")
    result = job.run("--nproc_per_node=2", f"--master_port={free_port()}", "-m", "jobpkg.train",
                     "--epochs", "1")
    assert result.returncode == 0, result.stderr
    assert [env["argv"] for _, env in sorted(job.envs().items())] == [["--epochs", "1"]] * 2


def test_output_is_prefixed_by_rank_on_the_right_stream(job):
    script = job.script(ENV_WORKER)
    result = job.run(script, "--nproc_per_node=2", f"--master_port={free_port()}")
    assert result.returncode == 0, result.stderr
    out_lines = set(result.stdout.splitlines())
    err_lines = set(result.stderr.splitlines())
    assert {"[rank 0] out 0", "[rank 1] out 1"} <= out_lines
    assert {"[rank 0] err 0", "[rank 1] err 1"} <= err_lines
    assert not any("err" in line for line in out_lines)


def test_no_prefix_passes_lines_through(job):
    script = job.script(ENV_WORKER)
    result = job.run(script, "--nproc_per_node=2", "--no-prefix", f"--master_port={free_port()}")
    assert result.returncode == 0, result.stderr
    assert sorted(line for line in result.stdout.splitlines()) == ["out 0", "out 1"]


def test_log_dir_holds_each_ranks_own_lines(job):
    script = job.script(ENV_WORKER + "print('no newline at the end', end='')\n")
    logs = job.dir / "logs"
    result = job.run(script, "--nproc_per_node=3", f"--log_dir={logs}",
                     f"--master_port={free_port()}")
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in logs.iterdir()) == ["rank_0.log", "rank_1.log", "rank_2.log"]
    for rank in range(3):
        lines = (logs / f"rank_{rank}.log").read_text().splitlines()
        assert sorted(lines) == sorted([f"out {rank}", f"err {rank}", "no newline at the end"])
        assert f"[rank {rank}] out {rank}" in result.stdout.splitlines()  # still shown live


def test_port_in_use_fails_before_starting_workers(job):
    script = job.script(ENV_WORKER)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = job.run(script, "--nproc_per_node=2", "--master_addr", "127.0.0.1",
                         "--master_port", str(port))
    assert result.returncode != 0
    assert "127.0.0.1" in result.stderr and str(port) in result.stderr
    assert "--standalone" in result.stderr
    assert job.envs() == {}  # no worker ran


def test_standalone_picks_a_free_port(job):
    script = job.script(ENV_WORKER)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        result = job.run(script, "--standalone", "--nproc_per_node=2", f"--master_port={port}")
    assert result.returncode == 0, result.stderr
    ports = {env["MASTER_PORT"] for env in job.envs().values()}
    assert len(ports) == 1 and ports != {str(port)}
    assert {env["MASTER_ADDR"] for env in job.envs().values()} == {"127.0.0.1"}


def test_two_nodes_number_ranks_by_node(job):
    port = free_port()
    script = job.script(ENV_WORKER)
    env = job.env(NEURAL_ARCH_SECRET="two-node-job-secret")
    nodes = [job.start(script, "--nnodes=2", f"--node_rank={node}", "--nproc_per_node=2",
                       "--master_addr=127.0.0.1", f"--master_port={port}", env=env)
             for node in (0, 1)]
    results = [job.finish(node) for node in nodes]
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    envs = job.envs()
    assert sorted(envs) == [(0, 0), (1, 0), (2, 0), (3, 0)]
    for (rank, _), worker_env in envs.items():
        expected = expected_contract(rank, 2, 2, rank // 2, port)
        assert {k: worker_env[k] for k in expected} == expected
        assert worker_env["NEURAL_ARCH_SECRET"] == "two-node-job-secret"
    assert "[rank 2] out 2" in results[1].stdout.splitlines()


def test_missing_script_is_named(job):
    result = job.run("--nproc_per_node=2", "no_such_train.py")
    assert result.returncode == 2
    assert "no_such_train.py" in result.stderr and "not found" in result.stderr



def test_no_python_runs_a_program(job):
    result = job.run("--no_python", "--nproc_per_node=2", f"--master_port={free_port()}", "sh",
                     "-c", 'echo "rank $RANK of $WORLD_SIZE"')
    assert result.returncode == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["[rank 0] rank 0 of 2", "[rank 1] rank 1 of 2"]


def our_segments() -> set:
    """Shared-memory segments in /dev/shm a job of ours may leave: the shm transport's
    (nf_<creator pid>_...) and Open MPI's (16 MiB each, left by every rank that started MPI
    alone, as the launcher's workers did before --backend mpi was refused)."""
    return {name for name in os.listdir("/dev/shm")
            if name.startswith(("nf_", "sm_segment.", "vader_segment."))}


SHM_WORKER = """
record_pid()
import numpy as np
import neural_arch.distributed as dist
dist.init_process_group(timeout=60)
buf = np.full(1 << 20, RANK + 1.0, dtype=np.float32)
dist.all_reduce(buf)
assert buf[0] == 3.0, buf[0]
print(f"backend {dist.get_backend()}")
"""


def test_backend_mpi_is_refused_before_any_worker_or_segment(job):
    before = our_segments()
    script = job.script(SHM_WORKER)
    result = job.run(script, "--nproc_per_node=2", f"--master_port={free_port()}",
                     "--backend", "mpi", "--lr", "1")
    assert our_segments() - before == set(), result.stderr
    assert job.recorded() == []  # no worker started
    assert result.returncode == 2
    assert "backend 'mpi' needs ranks started by MPI" in result.stderr
    assert f"-n 2 {sys.executable} {script} --lr 1" in result.stderr


def test_repeated_option_starts_nothing(job):
    before = our_segments()
    script = job.script(SHM_WORKER)
    result = job.run("--nproc_per_node=2", script, "--nproc_per_node=3")
    assert result.returncode == 2
    assert "--nproc_per_node is given 2 times ('2', '3')" in result.stderr
    assert job.recorded() == [] and our_segments() - before == set()


def test_shm_job_leaves_no_segment_behind(job):
    script = job.script(SHM_WORKER)
    result = job.run(script, "--nproc_per_node=2", f"--master_port={free_port()}",
                     "--backend=shm")
    assert result.returncode == 0, result.stderr
    assert "[rank 0] backend shm" in result.stdout.splitlines()
    pids = [pid for pid, _ in job.recorded()]
    assert len(pids) == 2
    assert [n for n in os.listdir("/dev/shm") if n.startswith(tuple(f"nf_{p}_" for p in pids))] \
        == []
