"""Two independent jobs on one host at once, on the same transport, with one user's secret:
each computes exactly what it alone would (their world sizes differ, so any mixing shows in
the sums), a rank maps only its own job's shared-memory segment, and a job's store never hears
from the other job's ranks. A second job started on the port the first one's store already
serves fails with named errors and leaves the first one running untouched.
"""
from __future__ import annotations

import json
import os
import re
import secrets
import time
from pathlib import Path

import numpy as np
import pytest

from dist_harness import free_port, installed_backends
from fault_injection_job import ELEMENTS
from fault_injector import launch_env, start_ranks
from neural_arch.distributed.health.heartbeat import KEY_PREFIX
from neural_arch.distributed.rendezvous.store import TCPStore

pytestmark = pytest.mark.timeout(150)
SIZES = {"A": 3, "B": 2}
READY_S = 60.0
SECOND_JOB_LIMIT_S = 15.0  # how long the second job's ranks get to fail on their own


def _wait(predicate, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.05)
    return predicate()


def _looping(out: Path, world_size: int) -> bool:
    return all((out / f"looping_{r}.json").exists() for r in range(world_size))


def _pids(out: Path, world_size: int) -> list[int]:
    return [json.loads((out / f"looping_{r}.json").read_text())["pid"] for r in range(world_size)]


def _mapped_segment_creators(pid: int) -> set[int]:
    """Creator pids of the nf_<pid>_... segments ``pid`` has mapped (unlinked ones included)."""
    with open(f"/proc/{pid}/maps") as f:
        return {int(m) for m in re.findall(r"/dev/shm/nf_(\d+)_", f.read())}


def _logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                     for p in sorted(out.glob("*.log")))


def _stop(procs: list, limit: float = 60.0) -> list:
    """Exit codes once every process ended (killed past ``limit``: -9)."""
    for proc in procs:
        try:
            proc.wait(limit)
        except Exception:  # subprocess.TimeoutExpired: ended below
            proc.kill()
            proc.wait(10)
    return [proc.returncode for proc in procs]


@pytest.mark.parametrize("backend", installed_backends())
def test_two_jobs_at_once_each_compute_exactly_their_own_sums(backend, tmp_path):
    secret, jobs = secrets.token_hex(16), {}  # one user: one secret for both
    try:
        for name, world_size in SIZES.items():
            out = tmp_path / name
            out.mkdir()
            env = {**os.environ}
            if backend != "mpi":  # under mpiexec, Open MPI's variables say who is who
                env.update(launch_env(world_size, free_port(), secret))
            jobs[name] = (out, env, start_ranks(out, backend, world_size, env))
        for name, (out, _, procs) in jobs.items():
            assert _wait(lambda: _looping(out, SIZES[name]), READY_S), _logs(out)
        # Both are running now: each rank maps its own job's segment only (shm), and each
        # store has heard from its own ranks only (job B has no rank 2).
        for name, (out, env, _) in jobs.items():
            pids = _pids(out, SIZES[name])
            for pid in pids:
                creators = _mapped_segment_creators(pid)
                assert creators <= set(pids), (name, pid, creators)
                assert creators or backend != "shm", (name, pid)
            if backend != "mpi":
                store = TCPStore("127.0.0.1", int(env["MASTER_PORT"]), secret=secret.encode(),
                                 timeout=30)
                expected = [True, True, name == "A"]

                def beats() -> list[bool]:
                    return [store.check([f"{KEY_PREFIX}/0/beat/{r}"]) for r in range(3)]
                # A rank reports looping before its heartbeat thread's first beat may have
                # reached the store: wait for its own ranks' beats, then compare.
                _wait(lambda: beats() == expected, READY_S)
                seen = beats()
                store.close()
                assert seen == expected, (name, seen)
        for out, _, _ in jobs.values():
            (out / "stop").touch()
        for name, (out, _, procs) in jobs.items():
            assert _stop(procs) == [0] * len(procs), _logs(out)
    finally:
        for _, _, procs in jobs.values():
            _stop(procs, limit=0.1)
    base = np.arange(ELEMENTS, dtype=np.float64) % 1000.0
    for name, (out, _, _) in jobs.items():
        assert not list(out.glob("error_*.json")), _logs(out)
        world_size = SIZES[name]
        for rank in range(world_size):
            done = json.loads((out / f"done_{rank}.json").read_text())
            expected = float((base * (world_size * (world_size + 1) // 2)).sum())
            assert done["steps"] > 3 and done["result_sum"] == expected, (name, done)


@pytest.mark.parametrize("backend, same_secret", [
    ("shm", True), ("shm", False), ("tcp", True), ("tcp", False)],
    ids=["shm-same-secret", "shm-other-secret", "tcp-same-secret", "tcp-other-secret"])
def test_a_second_job_on_the_same_port_fails_and_leaves_the_first_alone(backend, same_secret,
                                                                        tmp_path):
    port, secret = free_port(), secrets.token_hex(16)
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(), second.mkdir()
    first_env = {**os.environ, **launch_env(3, port, secret)}
    second_env = {**os.environ, **launch_env(3, port, secret if same_secret
                                             else secrets.token_hex(16))}
    running, late = start_ranks(first, backend, 3, first_env), []
    try:
        assert _wait(lambda: _looping(first, 3), READY_S), _logs(first)
        # A long collective timeout: only a failure found at once ends the second job in time.
        late = start_ranks(second, backend, 3, second_env, ["--timeout", "120"])
        _wait(lambda: all(p.poll() is not None for p in late), SECOND_JOB_LIMIT_S)
        codes = _stop(late, limit=0.1)
        assert codes == [1, 1, 1], (codes, _logs(second))
        for rank in range(3):
            log = (second / f"rank{rank}.log").read_text(errors="replace")
            named = re.findall(r"neural_arch\.distributed\.errors\.(\w+Error): (.*)", log)
            assert named, log
            if rank == 0:
                assert named[-1][0] == "RendezvousError" and "port in use" in named[-1][1], log
        assert not list(second.glob("looping_*.json"))  # none of them ever joined a job
        assert [p.poll() for p in running] == [None] * 3, _logs(first)
        (first / "stop").touch()
        assert _stop(running) == [0] * 3, _logs(first)
    finally:
        _stop(running + late, limit=0.1)
    assert not list(first.glob("error_*.json")), _logs(first)
    base = np.arange(ELEMENTS, dtype=np.float64) % 1000.0
    for rank in range(3):
        done = json.loads((first / f"done_{rank}.json").read_text())
        assert done["result_sum"] == float((base * 6).sum()), done
