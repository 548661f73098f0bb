"""Hostile connections at a job's ports: silent strangers by the hundred at the store and at the
ranks' data ports keep no rank out and stall no rendezvous, a stranger that never proves the
secret is dropped at its deadline (or, oldest first, to make room for a newer connection), and
a reset under the handshake is reported as a reset naming the address."""
from __future__ import annotations

import contextlib
import os
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from neural_arch.distributed.errors import AuthenticationError, RendezvousError
from neural_arch.distributed.rendezvous.auth import client_handshake
from neural_arch.distributed.group.backend_choice import backend_key
from neural_arch.distributed.rendezvous.gate import Gate
from neural_arch.distributed.rendezvous.store import TCPStore
from neural_arch.distributed.transports import tcp_mesh

from dist_harness import free_port, run_ranks
from leftovers import alive as _alive, segments_of
from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(120)
SECRET = b"hostile-connections-test-secret"
JOIN_S = 30.0
# The ranks' collective timeout under a flood: well above a normal 4-rank start on a loaded
# machine, well below the 30 s a stranger could once hold a handshake slot for.
FLOOD_TIMEOUT_S = 15.0


def _raise_descriptor_limit(needed: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        target = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))


def _connect_idle(port: int, count: int, opened: list, limit: float = JOIN_S) -> None:
    """Open ``count`` connections that never send a byte (retried while nobody listens yet)."""
    deadline = time.monotonic() + limit
    while count:
        try:
            opened.append(socket.create_connection(("127.0.0.1", port), timeout=5))
            count -= 1
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def _dropped(sock: socket.socket, limit: float = JOIN_S) -> bool:
    """True once the far end closed this connection (FIN or reset)."""
    sock.settimeout(limit)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


@contextlib.contextmanager
def _sockets():
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


# ----- the gate -----------------------------------------------------------------------------
def _gate_run(gate: Gate, stop: threading.Event, out: list) -> None:
    while not stop.is_set():
        for arrival in gate.poll(0.05):
            if arrival.conn is not None:
                arrival.accept()
            out.append(arrival)


@contextlib.contextmanager
def _running_gate(**options):
    listener = socket.create_server(("127.0.0.1", 0))
    gate = Gate(listener, SECRET, **options)
    stop, out = threading.Event(), []
    thread = threading.Thread(target=_gate_run, args=(gate, stop, out), daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], out
    finally:
        stop.set()
        thread.join(JOIN_S)
        gate.close()
        listener.close()
        for arrival in out:
            if arrival.conn is not None:
                arrival.conn.close()


def _wait_for(predicate, limit: float = JOIN_S) -> bool:
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_a_silent_stranger_is_dropped_at_its_deadline():
    with _running_gate(deadline_s=0.3) as (port, out), _sockets() as opened:
        _connect_idle(port, 1, opened)
        assert _dropped(opened[0])
        assert _wait_for(lambda: out)  # the gate hands the rejection over after closing
        assert [str(a.error) for a in out] == [
            f"{opened[0].getsockname()!s} sent no hello in time"]


def test_strangers_over_the_limit_displace_the_oldest_stranger_never_a_rank():
    with _running_gate(max_pending=4) as (port, out), _sockets() as opened:
        _connect_idle(port, 6, opened)
        assert _dropped(opened[0]) and _dropped(opened[1])  # the two oldest made room
        rank = socket.create_connection(("127.0.0.1", port), timeout=5)
        opened.append(rank)
        client_handshake(rank, SECRET, JOIN_S, client_info=b"rank 1")  # displaces one more
        assert _wait_for(lambda: any(a.conn is not None for a in out))
        assert [a.info for a in out if a.conn is not None] == [b"rank 1"]
        errors = [str(a.error) for a in out if a.conn is None]
        assert len(errors) == 3 and all("4 strangers were waiting" in e for e in errors), errors
        assert _dropped(opened[2])
        for sock in opened[3:6]:  # still waiting for their deadline
            sock.setblocking(False)
            with pytest.raises(BlockingIOError):
                sock.recv(1)


# ----- the store ----------------------------------------------------------------------------
def test_idle_connections_at_the_store_keep_no_client_out():
    _raise_descriptor_limit(2048)
    server = TCPStore("127.0.0.1", 0, world_size=4, is_server=True, secret=SECRET, timeout=2.0)
    try:
        with _sockets() as idle:
            _connect_idle(server.port, 300, idle)
            client = TCPStore("127.0.0.1", server.port, secret=SECRET, timeout=JOIN_S, rank=1)
            try:
                client.set("joined", b"yes")
                assert server.get("joined") == b"yes"
                assert server.num_clients == 2  # the strangers hold no client's place
            finally:
                client.close()
            # The deadline of a server with timeout 2 s is 2 s: every stranger is gone.
            assert all(_dropped(sock) for sock in idle)
    finally:
        server.close()


# A server process that may open few descriptors: strangers must not use up the ones a rank
# needs. The store keeps half of them for itself; a bare gate with no limit of its own runs out
# of them and must drop its oldest stranger to take the next connection in.
_FEW_DESCRIPTORS = """
import resource, socket, sys
from neural_arch.distributed.rendezvous.gate import Gate
from neural_arch.distributed.rendezvous.store import TCPStore
resource.setrlimit(resource.RLIMIT_NOFILE, (64, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
if sys.argv[2] == "store":
    store = TCPStore("127.0.0.1", 0, is_server=True, secret=sys.argv[1].encode(), timeout=60)
    print(store.port, flush=True)
    sys.stdin.read()
    store.close()
else:
    listener = socket.create_server(("127.0.0.1", 0), backlog=1024)
    gate = Gate(listener, sys.argv[1].encode(), deadline_s=60, max_pending=10_000)
    print(listener.getsockname()[1], flush=True)
    while True:
        for arrival in gate.poll(1.0):
            if arrival.conn is None:
                print("dropped:", arrival.error, flush=True)
                continue
            arrival.accept()
            print("admitted:", arrival.info.decode(), flush=True)
            sys.exit(0)
"""


@contextlib.contextmanager
def _server_with_few_descriptors(kind: str):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(REPO_ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
    proc = subprocess.Popen([sys.executable, "-c", _FEW_DESCRIPTORS, SECRET.decode(), kind],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    try:
        yield proc, int(proc.stdout.readline())
    finally:
        proc.stdin.close()
        try:
            proc.wait(JOIN_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(JOIN_S)
        proc.stdout.close()


def test_strangers_leave_a_store_the_descriptors_its_clients_need():
    with _server_with_few_descriptors("store") as (proc, port), _sockets() as idle:
        _connect_idle(port, 200, idle)
        with TCPStore("127.0.0.1", port, secret=SECRET, timeout=JOIN_S, rank=1) as client:
            client.set("joined", b"yes")
            assert client.get("joined") == b"yes"
    assert proc.returncode == 0


def test_a_gate_out_of_descriptors_drops_its_oldest_stranger_to_let_a_rank_in():
    with _server_with_few_descriptors("gate") as (proc, port), _sockets() as idle:
        _connect_idle(port, 100, idle)
        with socket.create_connection(("127.0.0.1", port), timeout=5) as rank:
            client_handshake(rank, SECRET, JOIN_S, client_info=b"rank 1")
        lines = proc.stdout.read().splitlines()
    assert lines[-1] == "admitted: rank 1", lines
    assert any("ran out of file descriptors" in line for line in lines), lines
    assert proc.returncode == 0


@contextlib.contextmanager
def _resetting_server():
    """Reads each client's hello, then resets the connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.05)
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except socket.timeout:
                continue
            with conn:
                conn.settimeout(5)
                conn.recv(36)
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(JOIN_S)
        listener.close()


def test_a_reset_under_the_handshake_is_a_connection_error_naming_the_address():
    with _resetting_server() as port:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            with pytest.raises(ConnectionError) as err:
                client_handshake(sock, SECRET, 5.0)
        assert not isinstance(err.value, AuthenticationError)
        assert f"('127.0.0.1', {port}) failed during challenge" in str(err.value)
        assert "reset" in str(err.value).lower()
        # The store's client tries again, as when refused, and names the reset at the end.
        with pytest.raises(RendezvousError) as err:
            TCPStore("127.0.0.1", port, secret=SECRET, timeout=1.0, rank=3)
        assert not isinstance(err.value, AuthenticationError)
        message = str(err.value)
        assert f"127.0.0.1:{port}" in message and "reset" in message.lower(), message
        assert "secret" not in message, message


# ----- floods against real jobs -------------------------------------------------------------
def _join_when_released(rank: int, world_size: int, backend: str, workdir: str) -> tuple:
    """Rank 0 starts at once; rank r joins when the test has flooded the ports before it."""
    from neural_arch import distributed as dist
    released = Path(workdir) / f"released_{rank}"
    deadline = time.monotonic() + JOIN_S
    while rank > 0 and not released.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"rank {rank} was never released")
        time.sleep(0.01)
    start = time.monotonic()
    dist.init_process_group(backend, timeout=FLOOD_TIMEOUT_S)
    seconds = time.monotonic() - start  # for the report's flood rows, never asserted here
    x = np.arange(1000, dtype=np.float64) * (rank + 1)
    dist.all_reduce(x)
    return os.getpid(), x, seconds


def _flood(port: int, world: int, at_store: int, at_data: dict, workdir: Path,
           opened: list, backend: str) -> None:
    """Flood the store, then release the ranks one by one, flooding each one's data port as
    soon as it publishes it: every peer that dials it finds the strangers already there. (The
    ranks first meet at the store to agree on the backend; the operator, who knows the secret,
    stands in for the ranks not released yet there, so rank 0 goes on to its data port.)"""
    _connect_idle(port, at_store, opened)
    with TCPStore("127.0.0.1", port, secret=SECRET, timeout=JOIN_S) as operator:
        for rank in range(1, world):
            operator.set(backend_key(rank), backend.encode())
        for rank in range(world):
            if rank > 0:
                (workdir / f"released_{rank}").touch()
            if at_data.get(rank):
                address = operator.get(tcp_mesh.address_key("tcp", rank), timeout=JOIN_S)
                _connect_idle(int(address.decode().rpartition(":")[2]), at_data[rank], opened)


def run_flooded_job(tmp_path: Path, backend: str, world: int, at_store: int,
                    at_data: dict) -> list:
    """Run a ``world``-rank job with ``at_store`` idle strangers at the store and ``at_data[r]``
    at rank r's data port; check every result and that nothing is left. Returns each rank's
    (pid, result, seconds in init_process_group) (``scripts/fault_injection_report.py`` times
    its flood rows with it)."""
    _raise_descriptor_limit(4096)
    port = free_port()
    env = {"MASTER_PORT": str(port), "NEURAL_ARCH_SECRET": SECRET.decode()}
    errors: list = []
    with _sockets() as opened:
        def flood() -> None:
            try:
                _flood(port, world, at_store, at_data, tmp_path, opened, backend)
            except Exception as e:  # reported by the test
                errors.append(e)

        flooder = threading.Thread(target=flood, daemon=True)
        flooder.start()
        try:
            results = run_ranks(_join_when_released, world, "none", timeout=90, env=env,
                                args=(backend, str(tmp_path)))
        finally:
            flooder.join(JOIN_S)
        assert not errors, errors
        assert len(opened) == at_store + sum(at_data.values())
    expected = np.arange(1000, dtype=np.float64) * (world * (world + 1) // 2)
    for pid, x, _ in results:
        np.testing.assert_array_equal(x, expected)
    pids = [pid for pid, _, _ in results]
    assert not [p for p in pids if _alive(p)] and segments_of(pids) == []
    return results


@pytest.mark.slow
@pytest.mark.parametrize("backend, world", [("shm", 4), ("tcp", 3)])
def test_idle_connections_at_the_store_keep_no_rank_out(tmp_path, backend, world):
    run_flooded_job(tmp_path, backend, world, at_store=300, at_data={})


@pytest.mark.slow
def test_idle_connections_at_the_data_ports_stall_no_mesh(tmp_path):
    run_flooded_job(tmp_path, "tcp", 4, at_store=0, at_data={0: 120, 1: 60, 2: 60})


@pytest.mark.slow
def test_five_hundred_idle_connections_at_every_port_stall_no_rendezvous(tmp_path):
    run_flooded_job(tmp_path, "tcp", 4, at_store=300, at_data={0: 100, 1: 50, 2: 50})
