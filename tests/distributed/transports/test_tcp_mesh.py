"""TCP mesh set-up: strangers at a rank's listening port (silent or talking garbage) delay nobody,
meshes of 2 to 4 ranks carry exact data between every pair, and a failed set-up names the
missing ranks and leaves no handshake thread or connection behind.

Ranks are threads of this process with real sockets and a real store, so the test can look at
the threads the set-up leaves behind."""
from __future__ import annotations

import contextlib
import os
import socket
import threading

import numpy as np
import pytest

from neural_arch.distributed.errors import AuthenticationError, RendezvousError
from neural_arch.distributed.rendezvous.auth import client_handshake
from neural_arch.distributed.rendezvous.store import TCPStore
from neural_arch.distributed.transports import tcp
from neural_arch.distributed.transports.base import Fingerprint
from neural_arch.distributed.transports.tcp_mesh import address_key

pytestmark = pytest.mark.timeout(60)
SECRET = b"tcp-mesh-test-secret"
# An accept loop that waited on a silent stranger for its whole handshake deadline (5 s) would,
# with three of them ahead of the peers, fail the mesh within this set-up timeout.
MESH_TIMEOUT_S = 8.0
JOIN_S = 30.0


def _payload(src: int, dst: int) -> np.ndarray:
    return np.random.default_rng(100 * src + dst).standard_normal(1000)


def _exchange_with_everyone(transport, rank: int, world: int) -> dict[int, np.ndarray]:
    """sendrecv with every peer in ascending order: the same global order of pairs everywhere,
    so no pair waits on another."""
    got = {}
    for peer in (p for p in range(world) if p != rank):
        got[peer] = np.empty(1000)
        fp = Fingerprint("pairwise", min(rank, peer) * world + max(rank, peer), "float64", 1000)
        transport.sendrecv(_payload(rank, peer), peer, got[peer], peer, fp)
    return got


class _Rank(threading.Thread):
    """One rank: joins the mesh, runs ``work`` on it, waits for the others, closes."""

    def __init__(self, rank: int, world: int, port: int, timeout: float, work=None,
                 done: threading.Barrier = None) -> None:
        super().__init__(name=f"test-rank-{rank}", daemon=True)
        self.rank, self.world, self.port, self.timeout = rank, world, port, timeout
        self.work, self.done = work, done
        self.value, self.error = None, None

    def run(self) -> None:
        store = TCPStore("127.0.0.1", self.port, secret=SECRET, timeout=JOIN_S)
        transport = None
        try:
            transport = tcp.create(self.rank, self.world, store, self.timeout, secret=SECRET)
            if self.work is not None:
                self.value = self.work(transport, self.rank, self.world)
            if self.done is not None:
                self.done.wait(JOIN_S)  # nobody says goodbye while a peer still reads
        except Exception as e:  # reported to the test through .error
            self.error = e
        finally:
            if transport is not None:
                transport.close()
            store.close()


@contextlib.contextmanager
def _store_server():
    server = TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=60)
    try:
        yield server
    finally:
        server.close()


@contextlib.contextmanager
def _strangers():
    """Connections opened by the test; every one is closed on exit."""
    opened: list[socket.socket] = []

    def connect(server, rank: int) -> socket.socket:
        address = server.get(address_key("tcp", rank), timeout=JOIN_S).decode()
        host, _, port = address.rpartition(":")
        opened.append(socket.create_connection((host, int(port)), timeout=JOIN_S))
        return opened[-1]
    try:
        yield connect
    finally:
        for sock in opened:
            sock.close()


def _cut_off(sock: socket.socket) -> bool:
    """True once the far end closed this connection (FIN or reset)."""
    sock.settimeout(JOIN_S)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def _join_all(ranks: list[_Rank]) -> None:
    for r in ranks:
        r.join(JOIN_S)
    assert not [r.name for r in ranks if r.is_alive()]


def _handshake_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("tcp-handshake")]


def _check_exchanges(ranks: list[_Rank]) -> None:
    assert [(r.rank, r.error) for r in ranks] == [(r.rank, None) for r in ranks]
    for r in ranks:
        assert sorted(r.value) == [p for p in range(r.world) if p != r.rank]
        for peer, got in r.value.items():
            np.testing.assert_array_equal(got, _payload(peer, r.rank))


@pytest.mark.parametrize("world", [2, 3])
def test_silent_strangers_ahead_of_the_peers_stall_nobody(world):
    done = threading.Barrier(world)
    with _store_server() as server, _strangers() as connect:
        ranks = [_Rank(r, world, server.port, MESH_TIMEOUT_S, _exchange_with_everyone, done)
                 for r in range(world)]
        ranks[0].start()
        # Queued ahead of every peer; they never send a byte.
        silent = [connect(server, 0) for _ in range(3)]
        for r in ranks[1:]:
            r.start()
        _join_all(ranks)
        _check_exchanges(ranks)
        # Set-up is over: the handshakes the strangers never finished were cut off.
        assert all(_cut_off(s) for s in silent)
        assert _handshake_threads() == []


def test_strangers_talking_garbage_are_rejected_and_the_mesh_forms():
    done = threading.Barrier(2)
    with _store_server() as server, _strangers() as connect:
        ranks = [_Rank(r, 2, server.port, MESH_TIMEOUT_S, _exchange_with_everyone, done)
                 for r in range(2)]
        ranks[0].start()
        junk = connect(server, 0)
        junk.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(64))
        assert _cut_off(junk)  # rejected while rank 0 still waits for its peer
        # Fails our check of rank 0's proof and then lingers, never sending its own proof:
        # waiting for it must hold up nobody either.
        with pytest.raises(AuthenticationError, match="does not know the job secret"):
            client_handshake(connect(server, 0), b"not-the-secret", JOIN_S)
        ranks[1].start()
        _join_all(ranks)
        _check_exchanges(ranks)
        assert _handshake_threads() == []


@pytest.mark.parametrize("world", [2, 3, 4])
def test_meshes_carry_exact_data_between_every_pair(world):
    done = threading.Barrier(world)
    with _store_server() as server:
        ranks = [_Rank(r, world, server.port, JOIN_S, _exchange_with_everyone, done)
                 for r in range(world)]
        for r in ranks:
            r.start()
        _join_all(ranks)
    _check_exchanges(ranks)
    assert _handshake_threads() == []


def test_failed_setup_names_missing_ranks_and_leaves_nothing_behind():
    with _store_server() as server, _strangers() as connect:
        ranks = [_Rank(r, 3, server.port, 3.0) for r in range(2)]  # rank 2 never comes
        ranks[0].start()
        silent = connect(server, 0)  # still handshaking when the deadline passes
        junk = connect(server, 0)
        junk.sendall(b"\x00" * 64)
        assert _cut_off(junk)
        ranks[1].start()
        _join_all(ranks)
        assert _cut_off(silent)
        assert _handshake_threads() == []
    errors = [r.error for r in ranks]
    assert all(isinstance(e, RendezvousError) for e in errors), errors
    first = errors[0]
    assert (first.rank, first.peer, first.op) == (0, None, "tcp.accept")
    assert "ranks [2] did not connect within 3.0 s" in str(first)
    # The silent stranger's deadline may pass before the set-up's and make it the last
    # rejection; either stranger is named rightly.
    assert "last rejected connection" in str(first)
    assert "does not speak this protocol" in str(first) or "sent no hello in time" in str(first)
    # rank 1 misses rank 2 as well, unless a loaded machine started it after rank 0 gave up
    assert errors[1].rank == 1
