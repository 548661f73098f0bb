"""The heartbeat: settings, the check wait loops call, rank 0's verdicts, the other ranks'
listening, a silent store, clean departures, and the pid watch used under MPI."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from neural_arch.distributed.errors import PeerFailureError
from neural_arch.distributed.health import heartbeat
from neural_arch.distributed.health.heartbeat import HeartbeatConfig
from neural_arch.distributed.rendezvous.store import TCPStore

from dist_harness import RankFailed, mpi_available, run_ranks

pytestmark = pytest.mark.timeout(90)
SECRET = b"heartbeat-test-secret"
FAST = HeartbeatConfig(True, 0.05, 0.6)
FAST_ENV = {"NEURAL_ARCH_HEARTBEAT_INTERVAL": "0.1", "NEURAL_ARCH_HEARTBEAT_TIMEOUT": "1.0"}
# Jobs that must see no failure get more slack: two shared cores can starve a thread briefly.
LEAVE_ENV = {"NEURAL_ARCH_HEARTBEAT_INTERVAL": "0.2", "NEURAL_ARCH_HEARTBEAT_TIMEOUT": "1.5"}
PREFIX = f"{heartbeat.KEY_PREFIX}/0"  # the first job on a fresh store


@pytest.fixture(autouse=True)
def no_monitor_left():
    yield
    heartbeat.stop()


def eventually(predicate, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


# ----- settings and the check ----------------------------------------------------------------
def test_settings_default_and_from_environment():
    assert heartbeat.config_from_env({}) == HeartbeatConfig(True, 0.5, 6.0)
    env = {"NEURAL_ARCH_HEARTBEAT": "off", "NEURAL_ARCH_HEARTBEAT_INTERVAL": " 0.25",
           "NEURAL_ARCH_HEARTBEAT_TIMEOUT": "3"}
    assert heartbeat.config_from_env(env) == HeartbeatConfig(False, 0.25, 3.0)


@pytest.mark.parametrize("name, value, words", [
    ("NEURAL_ARCH_HEARTBEAT", "maybe", "'maybe'"),
    ("NEURAL_ARCH_HEARTBEAT_INTERVAL", "fast", "'fast' is not a number"),
    ("NEURAL_ARCH_HEARTBEAT_INTERVAL", "-1", "'-1' must be a positive"),
    ("NEURAL_ARCH_HEARTBEAT_TIMEOUT", "nan", "'nan' must be a positive"),
    ("NEURAL_ARCH_HEARTBEAT_TIMEOUT", "0.7", "at least twice"),
])
def test_malformed_settings_name_variable_and_value(name, value, words):
    with pytest.raises(ValueError, match=name) as err:
        heartbeat.config_from_env({name: value})
    assert words in str(err.value)


def test_check_is_silent_until_a_failure_is_recorded_then_names_everything():
    heartbeat.check(0, "all_reduce:sum", 1)  # nothing known: no error
    assert heartbeat.record_failure(2, "no heartbeat for 6.1 s")
    assert not heartbeat.record_failure(2, "a second opinion")  # the first reason stays
    heartbeat.record_failure(3, "also gone")
    with pytest.raises(PeerFailureError) as err:
        heartbeat.check(1, "all_reduce:sum", 7)
    assert (err.value.rank, err.value.peer, err.value.op, err.value.seq) == (1, 2, "all_reduce:sum", 7)
    assert str(err.value) == ("[rank 1, all_reduce:sum #7, peer rank 2] heartbeat: peer rank 2 "
                              "failed: no heartbeat for 6.1 s; peer rank 3 failed: also gone")
    with pytest.raises(PeerFailureError, match="this rank was declared failed"):
        heartbeat.check(2, "broadcast", 1)
    heartbeat.stop()  # a new job starts clean
    heartbeat.check(1, "all_reduce:sum", 8)


def test_a_verdict_from_a_replaced_monitor_is_dropped():
    assert not heartbeat.record_failure(1, "late news", source=object())
    assert heartbeat.failures() == ()


# ----- the store monitor, driven by hand ------------------------------------------------------
@pytest.fixture
def server():
    store = TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=30)
    yield store
    heartbeat.stop()
    store.close()


def _beat_until(stop: threading.Event, store: TCPStore, rank: int) -> None:
    while not stop.wait(0.02):
        store.add(f"{PREFIX}/beat/{rank}", 1)
    store.add(f"{PREFIX}/beat/{rank}", heartbeat.LEFT_MARK)  # leaves cleanly


def test_rank0_declares_the_silent_peer_and_publishes_the_verdict(server):
    # The beating "rank 1" is a thread of this process, so a pause of the whole process would
    # silence it too: a longer timeout keeps such a pause from looking like its failure.
    config = HeartbeatConfig(True, 0.05, 1.0)
    client = TCPStore("127.0.0.1", server.port, secret=SECRET, timeout=30)
    stop = threading.Event()
    beater = threading.Thread(target=_beat_until, args=(stop, client, 1))
    assert heartbeat.start(0, 3, server, config=config) == "store"
    beater.start()
    try:
        assert eventually(lambda: heartbeat.failures(), 5.0)
        time.sleep(2 * config.timeout)  # rank 1 keeps beating: never declared
        assert [f.rank for f in heartbeat.failures()] == [2]
        verdict = json.loads(server.get(f"{PREFIX}/failed/1"))
        assert [f["rank"] for f in verdict["failures"]] == [2]
        assert "no heartbeat for" in verdict["failures"][0]["reason"]
        assert server.add(f"{PREFIX}/failed_version", 0) == 1
        with pytest.raises(PeerFailureError, match=r"\[rank 0, barrier #4, peer rank 2\]"):
            heartbeat.check(0, "barrier", 4)
    finally:
        stop.set()
        beater.join(5)
    time.sleep(2 * config.timeout)  # rank 1 left with its mark: silence is not failure
    assert [f.rank for f in heartbeat.failures()] == [2]
    assert heartbeat.status()["mode"] == "store"
    client.close()


def test_other_ranks_hear_rank0s_verdict_and_acknowledge_it(server):
    client = TCPStore("127.0.0.1", server.port, secret=SECRET)
    assert heartbeat.start(1, 3, client, config=FAST) == "store"
    assert eventually(lambda: server.check([f"{PREFIX}/beat/1"]), 5.0)
    heartbeat.check(1, "all_reduce:sum", 1)
    verdict = {"failures": [{"rank": 2, "reason": "no heartbeat for 6.0 s"}]}
    server.add(f"{PREFIX}/failed_version", 1)  # numbered first, written a little later
    time.sleep(3 * FAST.interval)
    heartbeat.check(1, "all_reduce:sum", 2)
    server.set(f"{PREFIX}/failed/1", json.dumps(verdict).encode())
    assert eventually(lambda: server.check([f"{PREFIX}/heard/1/1"]), 5.0)
    with pytest.raises(PeerFailureError) as err:
        heartbeat.check(1, "all_reduce:sum", 9)
    assert str(err.value) == ("[rank 1, all_reduce:sum #9, peer rank 2] heartbeat: peer rank 2 "
                              "failed: no heartbeat for 6.0 s")
    client.close()


STORE_SERVER = """
import sys, time
from neural_arch.distributed.rendezvous.store import TCPStore
store = TCPStore("127.0.0.1", 0, is_server=True, secret=sys.argv[1].encode(), timeout=30)
print(store.port, flush=True)
time.sleep(60)
"""


@pytest.fixture
def store_process():
    proc = subprocess.Popen([sys.executable, "-c", STORE_SERVER, SECRET.decode()],
                            stdout=subprocess.PIPE, text=True)
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        heartbeat.stop()
        proc.kill()  # also ends a stopped process
        proc.wait(10)
        proc.stdout.close()


def test_a_hung_store_host_is_declared_failed_within_the_timeout(store_process):
    proc, port = store_process
    client = TCPStore("127.0.0.1", port, secret=SECRET)
    heartbeat.start(2, 3, client, config=FAST)
    time.sleep(4 * FAST.interval)
    assert heartbeat.failures() == ()
    stopped_at = time.monotonic()
    os.kill(proc.pid, signal.SIGSTOP)
    assert eventually(lambda: heartbeat.failures(), 10 * FAST.timeout)
    detection = time.monotonic() - stopped_at
    # Not before the configured silence (counted from the last answer, at most one interval
    # before the stop); the upper bound is the ``eventually`` above.
    assert detection >= FAST.timeout - FAST.interval, detection
    (failure,) = heartbeat.failures()
    assert failure.rank == 0 and f"127.0.0.1:{port} has not answered" in failure.reason
    client.close()


@pytest.mark.parametrize("announced", [True, False])
def test_a_store_that_closes_is_a_failure_unless_rank0_said_it_leaves(store_process, announced):
    proc, port = store_process
    client = TCPStore("127.0.0.1", port, secret=SECRET)
    heartbeat.start(1, 2, client, config=FAST)
    time.sleep(4 * FAST.interval)
    if announced:  # what rank 0's monitor does before destroy_process_group closes the store
        client.set(f"{PREFIX}/failed/{client.add(f'{PREFIX}/failed_version', 1)}",
                   json.dumps({"rank0_leaving": True}).encode())
        assert eventually(lambda: client.check([f"{PREFIX}/heard/1/1"]), 5.0)
    proc.terminate()
    proc.wait(10)
    assert eventually(lambda: not heartbeat.status()["running"], 5.0)
    if announced:
        time.sleep(2 * FAST.timeout)
        assert heartbeat.failures() == ()
        assert "rank 0 left the job" in heartbeat.status()["note"]
    else:
        (failure,) = heartbeat.failures()
        assert failure.rank == 0 and "closed while rank 0 was still in the job" in failure.reason
    client.close()


# ----- real jobs ----------------------------------------------------------------------------------
def _status(rank, world_size):
    from neural_arch import distributed as dist
    return dist.get_distributed_info()["heartbeat"]


def test_status_is_reported_by_get_distributed_info():
    statuses = run_ranks(_status, 2, "tcp", env=FAST_ENV)
    for status in statuses:
        assert (status["mode"], status["running"], status["failures"]) == ("store", True, [])
        assert (status["interval"], status["timeout"]) == (0.1, 1.0)
    off = run_ranks(_status, 2, "tcp", env={"NEURAL_ARCH_HEARTBEAT": "0"})
    assert [s["mode"] for s in off] == ["off", "off"]


def test_malformed_setting_fails_init_with_its_name():
    with pytest.raises(RankFailed, match="NEURAL_ARCH_HEARTBEAT_TIMEOUT='soon'"):
        run_ranks(_status, 2, "tcp", env={"NEURAL_ARCH_HEARTBEAT_TIMEOUT": "soon"})


def _leave_early(rank, world_size, leaver):
    from neural_arch import distributed as dist
    stayers = [r for r in range(world_size) if r != leaver]
    group = dist.new_group(stayers)
    if rank == leaver:
        dist.destroy_process_group()
        return None
    # Keep working well past the heartbeat timeout after the peer left. The last element says
    # "my time is up": its sum ends the loop on every stayer after the same round, so none is
    # left calling a collective that its peers, already gone, will never join.
    sums, deadline = [], time.monotonic() + 3.5
    while True:
        x = np.append(np.arange(8, dtype=np.float64) * (rank + 1), time.monotonic() >= deadline)
        dist.all_reduce(x, group=group)
        sums.append(np.array_equal(x[:8], np.arange(8) * sum(r + 1 for r in stayers)))
        if x[8] > 0:
            break
        time.sleep(0.05)
    return all(sums), len(sums), dist.get_distributed_info()["heartbeat"]["failures"]


@pytest.mark.parametrize("backend", ["tcp", "shm"])
@pytest.mark.parametrize("leaver", [2, 0], ids=["last-rank-leaves", "store-host-leaves"])
def test_a_rank_that_leaves_cleanly_is_not_declared_failed(backend, leaver):
    results = run_ranks(_leave_early, 3, backend, args=(leaver,), env=LEAVE_ENV)
    for rank, result in enumerate(results):
        if rank != leaver:
            exact, rounds, failures = result
            assert exact and rounds > 10 and failures == [], result


# ----- MPI: same-host peers watched by pid --------------------------------------------------------
def _hang_under_mpi(rank, world_size, out_dir):
    from neural_arch import distributed as dist
    assert dist.get_distributed_info()["heartbeat"]["mode"] == "pids"
    pids = dist.all_gather_object(os.getpid())
    x = np.ones(4)
    dist.all_reduce(x)
    if rank == 1:
        with open(os.path.join(out_dir, "stopped_at"), "w") as f:
            f.write(repr(time.time()))
        os.kill(os.getpid(), signal.SIGSTOP)
    try:
        for _ in range(100_000):
            dist.all_reduce(x)
    except PeerFailureError as e:
        record = {"time": time.time(), "message": str(e), "peer": e.peer}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    if rank == 0:  # both survivors have reported: end the stopped rank
        eventually(lambda: os.path.exists(os.path.join(out_dir, "rank2.json")), 20.0)
        os.kill(pids[1], signal.SIGKILL)
    return record


@pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")
def test_mpi_survivors_name_a_stopped_same_host_peer(tmp_path):
    try:
        run_ranks(_hang_under_mpi, 3, "mpi", args=(str(tmp_path),), env=FAST_ENV, timeout=60)
    except RankFailed:
        pass  # the stopped rank never reports: only the survivors' records matter
    stopped_at = float((tmp_path / "stopped_at").read_text())
    for rank in (0, 2):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["peer"] == 1, record
        assert record["message"].startswith(f"[rank {rank}, all_reduce:sum #"), record
        assert "has been stopped for" in record["message"], record
        assert record["time"] - stopped_at < 10.0, record


class _PidTransport:
    """What ``heartbeat.start`` reads of an MPI transport: its same-host peers' pids, and the
    word it sends its peers (here written down)."""

    def __init__(self, pids: dict) -> None:
        self.local_peer_pids, self.told = pids, []

    def publish_failure(self, peer: int, reason: str) -> None:
        self.told.append((peer, reason, threading.current_thread().name))


def test_the_pid_watch_verdict_is_told_to_the_peers_by_the_rank_that_raises_for_it():
    # The pid watch's thread may not call MPI: its verdict on a stopped peer reaches the other
    # ranks only when this rank's wait raises for it. Untold, a peer that had not yet seen the
    # stop itself saw this rank leave first and named it instead of the stopped rank.
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        transport = _PidTransport({2: sleeper.pid})
        assert heartbeat.start(1, 3, transport=transport, config=FAST) == "pids"
        os.kill(sleeper.pid, signal.SIGSTOP)
        assert eventually(lambda: heartbeat.failures() != (), 10.0)
        assert transport.told == []  # not from the monitor's thread
        with pytest.raises(PeerFailureError) as raised:
            heartbeat.check(1, "all_reduce:sum", 5)
        assert raised.value.peer == 2
        heartbeat.report(raised.value)
        [(peer, reason, thread)] = transport.told
        assert peer == 2 and thread == threading.current_thread().name
        assert reason.startswith(f"rank 1 saw: its process (pid {sleeper.pid}) has been stopped "
                                 "for "), reason
        heartbeat.report(raised.value)  # told once
        assert len(transport.told) == 1
    finally:
        sleeper.kill()
        sleeper.wait()


def test_a_failure_a_transport_found_is_shared_with_the_other_ranks(server):
    client = TCPStore("127.0.0.1", server.port, secret=SECRET)
    heartbeat.start(1, 3, client, config=FAST)
    error = PeerFailureError("lost peer rank 2 during all_reduce:sum #3: it closed the "
                             "connection", rank=1, peer=2, op="all_reduce:sum", seq=3)
    run = heartbeat.reporting(lambda: (_ for _ in ()).throw(error))
    with pytest.raises(PeerFailureError) as raised:
        run()
    assert raised.value is error
    assert eventually(lambda: server.check([f"{PREFIX}/failed/1"]), 5.0)
    verdict = json.loads(server.get(f"{PREFIX}/failed/1"))
    reason = "rank 1 saw: lost peer rank 2 during all_reduce:sum #3: it closed the connection"
    assert verdict == {"failures": [{"rank": 2, "reason": reason}]}
    with pytest.raises(PeerFailureError, match=r"\[rank 1, barrier #4, peer rank 2\] heartbeat"):
        heartbeat.check(1, "barrier", 4)  # this rank's next waits name the same peer
    server.set(f"{PREFIX}/heard/1/0", b"1")  # rank 0 heard it (rank 2 failed): no linger
    heartbeat.stop()
    assert server.add(f"{PREFIX}/beat/1", 0) >= heartbeat.LEFT_MARK
    client.close()


def test_a_rank_that_only_heard_a_verdict_leaves_after_its_live_peers_heard_it(server):
    # Rank 2 published that it failed; rank 1 hears it and leaves cleanly. Leaving at once
    # would let rank 0, still waiting on rank 1, see rank 1 go before hearing of rank 2, and
    # blame rank 1: rank 1 must linger until rank 0 has read the verdict.
    server.add(f"{PREFIX}/failed_version", 1)
    reason = "the pipeline stage raised ValueError (stage 2, forward)"
    server.set(f"{PREFIX}/failed/1", json.dumps(
        {"failures": [{"rank": 2, "reason": reason}]}).encode())
    server.set(f"{PREFIX}/heard/1/2", b"1")  # its writer
    client = TCPStore("127.0.0.1", server.port, secret=SECRET)
    # a 1 s interval lingers up to 2.5 s: room for a slow machine to run the timer below
    heartbeat.start(1, 3, client, config=HeartbeatConfig(True, 1.0, 4.0))
    assert eventually(lambda: heartbeat.failures(), 5.0)
    assert [f.rank for f in heartbeat.failures()] == [2]
    heard = threading.Timer(0.3, server.set, args=(f"{PREFIX}/heard/1/0", b"1"))
    heard.start()  # rank 0 reads the verdict a moment later
    heartbeat.stop()
    assert server.check([f"{PREFIX}/heard/1/0"])  # rank 1 did not leave before that
    heard.join()
    assert server.add(f"{PREFIX}/beat/1", 0) >= heartbeat.LEFT_MARK
    client.close()


def test_a_rank_that_leaves_without_destroy_declares_itself_failed(server):
    # As the exit hooks do for a program that ended with its process group in use: peers may
    # still wait for this rank, so they must name it rather than take its leaving for clean.
    client = TCPStore("127.0.0.1", server.port, secret=SECRET)
    heartbeat.start(1, 2, client, config=FAST)
    assert eventually(lambda: server.check([f"{PREFIX}/beat/1"]), 5.0)
    heard = threading.Timer(0.2, server.set, args=(f"{PREFIX}/heard/1/0", b"1"))
    heard.start()  # rank 0 reads the verdict a moment later; the leaving rank waits for that
    heartbeat.stop(abandoned=True)
    heard.join()
    verdict = json.loads(server.get(f"{PREFIX}/failed/1", timeout=1.0))
    assert verdict == {"failures": [{"rank": 1, "reason": heartbeat.ABANDONED_REASON}]}
    assert server.add(f"{PREFIX}/beat/1", 0) >= heartbeat.LEFT_MARK  # not taken for hung
    client.close()
