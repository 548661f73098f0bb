"""MPI jobs whose ranks cannot see each other's pids, as on several hosts: the heartbeat store of
``mpi_heartbeat`` and MPI's own failure reports (ULFM) must name a stopped or killed rank.

Other hosts are simulated with a pid namespace per rank (``unshare --pid``, needs root), over
Open MPI's TCP transport (its shared-memory one needs the peers' pids).
"""
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from dist_harness import mpi_available
from mpiexec_launch import run_until_launched
from neural_arch.distributed.health import mpi_heartbeat
from repo_paths import REPO_ROOT as REPO

FAST_ENV = {"NEURAL_ARCH_HEARTBEAT_INTERVAL": "0.2", "NEURAL_ARCH_HEARTBEAT_TIMEOUT": "2.0"}

JOB = textwrap.dedent("""
    import json, os, signal, sys, time
    import numpy as np
    victim, how, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    if os.environ.get("UNREACHABLE_RANK") == str(rank):
        from neural_arch.distributed.health import mpi_heartbeat
        mpi_heartbeat._connect = lambda *args: (None, "connection refused for the test")
    import warnings
    warnings.simplefilter("always")
    from neural_arch import distributed as dist
    from neural_arch.distributed.errors import PeerFailureError
    with warnings.catch_warnings(record=True) as caught:
        dist.init_process_group("mpi", timeout=120)
    world = dist.get_world_size()
    record = {"mode": dist.get_distributed_info()["heartbeat"]["mode"],
              "warnings": [str(w.message) for w in caught],
              "pid": int(os.readlink("/proc/self"))}  # as seen outside a pid namespace
    x = np.full(4099, rank + 1.0)
    dist.all_reduce(x)
    record["sum_ok"] = bool(np.all(x == world * (world + 1) / 2))

    def write(name, value):
        with open(os.path.join(out, name + ".tmp"), "w") as f:
            json.dump(value, f)
        os.replace(os.path.join(out, name + ".tmp"), os.path.join(out, name))

    write(f"start{rank}.json", record)
    dist.barrier()
    if how == "none":
        dist.destroy_process_group()
        write(f"rank{rank}.json", record)
        sys.exit(0)
    if rank == victim:
        time.sleep(0.3)
        write("fault_at.json", time.time())
        os.kill(os.getpid(), getattr(signal, how))
    start = time.monotonic()
    try:
        while True:
            dist.all_reduce(x)
    except PeerFailureError as e:
        record.update(seconds=time.monotonic() - start, raised_at=time.time(), peer=e.peer,
                      message=str(e))
    write(f"rank{rank}.json", record)
    # Stay until every survivor has reported: this rank's exit could end the job under MPI.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
            os.path.exists(os.path.join(out, f"rank{r}.json")) for r in range(world)
            if r != victim):
        time.sleep(0.05)
    os._exit(0)
""")


def namespaces_work() -> bool:
    if not shutil.which("unshare") or os.geteuid() != 0:
        return False
    try:
        return subprocess.run(["unshare", "--pid", "--fork", "true"], timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


needs_mpi = pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec not installed")
needs_namespaces = pytest.mark.skipif(not (mpi_available() and namespaces_work()),
                                      reason="needs mpiexec, root and unshare --pid")


def run_job(tmp_path, ranks, victim=-1, how="none", env=(), namespaces=False, ulfm=False):
    """Run JOB under mpiexec (``how``: a signal name for ``victim`` to send itself, or "none");
    return ({rank: record} of the ranks that reported, mpiexec's output)."""
    import json
    env = dict(env)
    job, out = tmp_path / "job.py", tmp_path / "out"
    job.write_text(JOB)
    out.mkdir()
    environ = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                   OMPI_MCA_rmaps_base_oversubscribe="1",
                   OMPI_MCA_btl_sm_backing_directory=str(tmp_path),
                   PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
                   **env)
    command = [sys.executable, str(job), str(victim), how, str(out)]
    if namespaces:  # the shell keeps the rank from being its namespace's init, which shrugs
        # off signals it sends itself
        command = ["unshare", "--pid", "--fork", "sh", "-c", " ".join(command) + "; exit $?"]
    mpi_options = ["--mca", "btl", "tcp,self"] if namespaces else []
    mpi_options += ["--with-ft", "ulfm"] if ulfm else []
    mpi_options += ["--enable-recovery"] if how != "none" else []
    exported = [arg for name in env for arg in ("-x", name)]
    argv = ["mpiexec", "-n", str(ranks), "--oversubscribe", *mpi_options, *exported, *command]
    # A stopped rank keeps mpiexec waiting: the job is over once every other rank reported.
    expected = [out / f"rank{r}.json" for r in range(ranks) if r != victim]

    def run_once():
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=environ, cwd=tmp_path, start_new_session=True)
        deadline = time.monotonic() + 90
        try:
            while proc.poll() is None and time.monotonic() < deadline and \
                    not all(path.exists() for path in expected):
                time.sleep(0.1)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            output = proc.communicate(timeout=30)[0]
            for start in out.glob("start*.json"):  # a stopped rank may sit outside the session
                try:
                    os.kill(json.loads(start.read_text())["pid"], signal.SIGKILL)
                except (OSError, ValueError, KeyError):
                    pass
        return output
    # a rank that started left start<R>.json: then whatever the job printed is the test's
    output = run_until_launched(
        run_once, output_of=lambda output: "" if any(out.glob("start*.json")) else output)
    records = {int(p.stem[4:]): json.loads(p.read_text()) for p in out.glob("rank*.json")}
    return records, output


@needs_namespaces
@pytest.mark.parametrize("victim", [0, 2])
def test_a_stopped_rank_out_of_pid_sight_is_named_by_every_survivor(tmp_path, victim):
    records, output = run_job(tmp_path, 3, victim, "SIGSTOP", FAST_ENV.items(), namespaces=True)
    survivors = [r for r in range(3) if r != victim]
    assert sorted(records) == survivors, output[-3000:]
    for rank in survivors:
        record = records[rank]
        assert record["mode"] == "store" and record["sum_ok"], record
        assert record["peer"] == victim, record
        assert record["message"].startswith(f"[rank {rank}, all_reduce:sum #"), record
        assert "heartbeat" in record["message"], record
        assert record["seconds"] < 10.0, record


@needs_namespaces
def test_a_killed_rank_is_named_from_mpis_failure_report(tmp_path):
    records, output = run_job(tmp_path, 3, 1, "SIGKILL", namespaces=True, ulfm=True)
    assert sorted(records) == [0, 2], output[-3000:]
    for rank in (0, 2):
        record = records[rank]
        assert record["peer"] == 1, record
        assert "MPI reports rank(s) [1] failed" in record["message"], record
        assert record["seconds"] < 10.0, record


@needs_mpi
def test_a_forced_store_serves_a_one_host_job_and_leaves_cleanly(tmp_path):
    env = {mpi_heartbeat.MODE_ENV: "store", **FAST_ENV}
    records, output = run_job(tmp_path, 3, env=env.items())
    assert sorted(records) == [0, 1, 2], output[-3000:]
    assert all(r["mode"] == "store" and r["sum_ok"] and not r["warnings"]
               for r in records.values()), records


@needs_mpi
def test_a_rank_that_cannot_reach_the_store_makes_every_rank_fall_back(tmp_path):
    env = {mpi_heartbeat.MODE_ENV: "store", "UNREACHABLE_RANK": "1", **FAST_ENV}
    records, output = run_job(tmp_path, 3, env=env.items())
    assert sorted(records) == [0, 1, 2], output[-3000:]
    for rank, record in records.items():
        assert record["mode"] == "pids" and record["sum_ok"], record
        assert len(record["warnings"]) == 1, record
        assert f"rank {rank}: rank(s) [1] could not reach rank 0's heartbeat store" in \
            record["warnings"][0], record
    assert "connection refused for the test" in records[1]["warnings"][0]


def test_mode_comes_from_the_environment():
    assert mpi_heartbeat.mode_from_env({}) == "auto"
    assert mpi_heartbeat.mode_from_env({mpi_heartbeat.MODE_ENV: " Store "}) == "store"
    with pytest.raises(ValueError, match=r"NEURAL_ARCH_MPI_HEARTBEAT='sometimes'.*'pid'"):
        mpi_heartbeat.mode_from_env({mpi_heartbeat.MODE_ENV: "sometimes"})


def test_candidate_addresses_leave_out_loopback(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    hosts = mpi_heartbeat.candidate_hosts()
    assert hosts and len(set(hosts)) == len(hosts)
    assert hosts == ["127.0.0.1"] or not any(mpi_heartbeat.is_loopback(h) for h in hosts)
    monkeypatch.setenv("MASTER_ADDR", "node17.cluster")
    assert mpi_heartbeat.candidate_hosts()[0] == "node17.cluster"


class _Transport:
    rank, world_size = 0, 3

    def __init__(self, local_peers):
        self.local_peer_pids = local_peers

    @property
    def comm(self):
        raise AssertionError("no MPI traffic expected")


@pytest.mark.parametrize("mode, local_peers", [("auto", {1: 11, 2: 12}), ("pid", {}),
                                               ("pid", {1: 11})])
def test_no_store_when_every_peer_is_in_sight_or_the_mode_says_so(mode, local_peers):
    assert mpi_heartbeat.heartbeat_store(_Transport(local_peers), 10.0, mode) is None


def test_no_store_when_the_heartbeat_is_off(monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_HEARTBEAT", "0")
    assert mpi_heartbeat.heartbeat_store(_Transport({}), 10.0, "store") is None
