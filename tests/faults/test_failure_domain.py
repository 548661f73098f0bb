"""A job is one failure domain, watched from init on.

A rank that dies or hangs fails the collectives of every other rank, those of a subgroup it is
not in included: no survivor runs on, none exits 0, and every one names that rank. A rank that
stops right after ``init_process_group``, before its first collective and while the heartbeat
is still connecting to the store, is declared failed by name at the heartbeat's usual timeout,
not after connection attempts that each waited a timeout of their own.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from neural_arch.distributed.errors import DistributedError
from neural_arch.distributed.health import heartbeat
from neural_arch.distributed.health.heartbeat import TIMEOUT_ENV, HeartbeatConfig
from neural_arch.distributed.rendezvous.store import TCPStore

from dist_harness import RankFailed, mpi_available, run_ranks
from fault_injector import FaultOutcome, run_fault

pytestmark = pytest.mark.timeout(150)
DETECT_LIMIT_S = 20.0  # how long the survivors are given; detection takes 0.1 s to 4 s
# The jobs' heartbeat timeout: shorter than the 6 s default, so that a hung rank is declared
# sooner, and still many intervals (0.5 s) long, so that a healthy rank never looks silent.
HEARTBEAT_TIMEOUT_S = 3.0
JOB_ENV = {TIMEOUT_ENV: str(HEARTBEAT_TIMEOUT_S)}
# A verdict's silence is the heartbeat timeout plus scheduling; connection attempts that each
# wait their own timeout would make it about twice the timeout.
SILENCE_LIMIT = 1.5
# The jobs' verdicts: their timeout plus at most this much scheduling on a busy machine (the
# twice-the-timeout failure would add a whole 3 s)
SCHEDULING_SLACK_S = 2.0
_SILENCE = re.compile(r"(?:has not answered|no heartbeat) for ([0-9.]+) s")


def reported_silence(message: str) -> float:
    """The silence a heartbeat verdict states ("... for 3.0 s ...")."""
    found = _SILENCE.search(message)
    assert found, message
    return float(found.group(1))


def assert_every_survivor_named(outcome: FaultOutcome) -> None:
    """Every survivor raised PeerFailureError naming the victim in its all-reduce and exited 1;
    no process and no shared-memory segment is left."""
    for rank in outcome.survivors:
        error = outcome.errors.get(rank)
        assert error is not None, (f"rank {rank} reported no error (exit code "
                                   f"{outcome.exit_codes[rank]}):\n{outcome.logs}")
        assert error["type"] == "PeerFailureError", error
        assert error["peer"] == outcome.victim, error
        assert error["op"] == "all_reduce:sum", error
        assert error["message"].startswith(
            f"[rank {rank}, all_reduce:sum #{error['seq']}, peer rank {outcome.victim}]"), error
        assert outcome.exit_codes[rank] == 1, outcome.exit_codes
    assert outcome.leftover_pids == [], outcome.leftover_pids
    assert outcome.leftover_segments == [], outcome.leftover_segments


# ----- a rank outside the subgroup that loops -----------------------------------------------------
OUTSIDE = [(3, [0, 1], 2), (4, [0, 1, 2], 3), (3, [1, 2], 0)]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("world_size, group, victim", OUTSIDE,
                         ids=["3-ranks-last-dies", "4-ranks-last-dies", "3-ranks-store-host-dies"])
def test_a_rank_outside_the_subgroup_that_dies_fails_every_survivor(backend, world_size, group,
                                                                     victim, tmp_path):
    outcome = run_fault("kill", backend, world_size, victim, tmp_path,
                        detect_limit=DETECT_LIMIT_S, group=group, env=JOB_ENV)
    assert outcome.exit_codes[victim] == -9
    assert_every_survivor_named(outcome)


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_rank_outside_the_subgroup_that_hangs_fails_every_survivor(backend, tmp_path):
    outcome = run_fault("stop", backend, 3, 2, tmp_path, detect_limit=DETECT_LIMIT_S,
                        group=[0, 1], env=JOB_ENV)
    assert_every_survivor_named(outcome)
    for rank in outcome.survivors:
        assert "heartbeat: peer rank 2 failed" in outcome.errors[rank]["message"]


def _loop_in_subgroup_under_mpi(rank, world_size, fault, out_dir):
    """Ranks 0 and 1 all-reduce on their subgroup; rank 2, outside it, is killed or stopped."""
    from neural_arch import distributed as dist
    group = dist.new_group([0, 1])
    pids = dist.all_gather_object(os.getpid())
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        return None
    record, x = {"type": None, "peer": None, "message": "ran on"}, np.ones(4)
    run_on_until = time.monotonic() + DETECT_LIMIT_S
    try:
        while time.monotonic() < run_on_until:
            dist.all_reduce(x, group=group)
    except DistributedError as e:
        record = {"type": type(e).__name__, "peer": e.peer, "message": str(e)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    if fault == "stop" and rank == 0:  # both survivors have reported: end the stopped rank
        deadline = time.monotonic() + DETECT_LIMIT_S
        while time.monotonic() < deadline and not os.path.exists(
                os.path.join(out_dir, "rank1.json")):
            time.sleep(0.05)
        os.kill(pids[2], signal.SIGKILL)
    return record


@pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_mpi_a_rank_outside_the_subgroup_fails_every_survivor(fault, tmp_path):
    # Under plain mpiexec a killed rank aborts the whole job (nothing to detect); with
    # --enable-recovery (what may_die asks for) the survivors go on and must find it.
    try:
        run_ranks(_loop_in_subgroup_under_mpi, 3, "mpi", args=(fault, str(tmp_path)),
                  may_die=[2] if fault == "kill" else (), timeout=90, env=JOB_ENV,
                  init_kwargs={"timeout": 60})
    except RankFailed:
        pass  # killing the stopped rank under plain mpiexec ends the job: the files remain
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["type"] == "PeerFailureError" and record["peer"] == 2, record
        assert record["message"].startswith(f"[rank {rank}, all_reduce:sum #"), record


# ----- a rank stopped right after init ----------------------------------------------------------
@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("victim", [0, 2], ids=["store-host", "last"])
def test_a_rank_stopped_right_after_init_is_named_at_the_heartbeat_timeout(backend, victim,
                                                                           tmp_path):
    outcome = run_fault("stop_early", backend, 3, victim, tmp_path, detect_limit=DETECT_LIMIT_S,
                        env=JOB_ENV)
    assert_every_survivor_named(outcome)
    for rank in outcome.survivors:
        error = outcome.errors[rank]
        assert error["seq"] == 1, error  # the first collective never completed
        assert f"heartbeat: peer rank {victim} failed" in error["message"], error
        assert reported_silence(error["message"]) < HEARTBEAT_TIMEOUT_S + SCHEDULING_SLACK_S, \
            error


STORE_SERVER = """
import sys, time
from neural_arch.distributed.rendezvous.store import TCPStore
store = TCPStore("127.0.0.1", 0, is_server=True, secret=sys.argv[1].encode(), timeout=30)
print(store.port, flush=True)
time.sleep(120)
"""
SECRET = b"failure-domain-test-secret"


def test_a_store_host_stopped_before_the_heartbeat_connects_is_declared_at_the_timeout():
    # The monitor's first connection gets no handshake answer: it must give up when the
    # store's silence reaches the timeout, not at the end of a handshake timeout of its own.
    config = HeartbeatConfig(True, 0.1, 2.0)
    proc = subprocess.Popen([sys.executable, "-c", STORE_SERVER, SECRET.decode()],
                            stdout=subprocess.PIPE, text=True)
    client = None
    try:
        client = TCPStore("127.0.0.1", int(proc.stdout.readline()), secret=SECRET, timeout=30)
        os.kill(proc.pid, signal.SIGSTOP)
        assert heartbeat.start(1, 2, client, config=config) == "store"
        deadline = time.monotonic() + 10 * config.timeout
        while not heartbeat.failures() and time.monotonic() < deadline:
            time.sleep(0.02)
        (failure,) = heartbeat.failures()
        assert failure.rank == 0 and "has not answered" in failure.reason, failure
        assert reported_silence(failure.reason) < SILENCE_LIMIT * config.timeout, failure
    finally:
        heartbeat.stop()
        if client is not None:
            client.close()
        proc.kill()  # ends a stopped process too
        proc.wait(10)
        proc.stdout.close()
