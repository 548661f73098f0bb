"""TCP transport across real processes: exact exchanges, mismatches, dead peers, timeouts."""
import multiprocessing as mp
import os
import signal
import socket
import time

import numpy as np
import pytest

from neural_arch.distributed.errors import (AuthenticationError, CollectiveMismatchError,
                                            PeerFailureError)
from neural_arch.distributed.rendezvous.auth import client_handshake
from neural_arch.distributed.rendezvous.store import TCPStore, barrier
from neural_arch.distributed.transports import tcp
from neural_arch.distributed.transports.base import Fingerprint

pytestmark = pytest.mark.timeout(120)
SECRET = b"tcp-transport-test"
CASES = [(0, "float64"), (1, "float64"), (7, "float32"), (33, "float16"), (12_345, "int32"),
         (1_000_003, "float64")]


def _payload(rank, n, dtype):
    rng = np.random.default_rng(1_000 * rank + n)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-2**31, 2**31 - 1, n).astype(dtype)
    return rng.standard_normal(n).astype(dtype)


def _join(rank, world, port, timeout=30.0, prefix="tcp"):
    store = TCPStore("127.0.0.1", port, secret=SECRET, timeout=30)
    return store, tcp.create(rank, world, store, timeout, secret=SECRET, prefix=prefix)


def _report(out, rank, fn):
    try:
        out.put((rank, "ok", fn()))
    except Exception as e:
        out.put((rank, type(e).__name__, (str(e), getattr(e, "peer", None))))


class _Job:
    """A store served here and `world` spawned ranks; every child is killed on exit."""

    def __init__(self, target, world, *args, autostart=True):
        self.autostart = autostart
        self.server = TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=60)
        ctx = mp.get_context("spawn")
        self.out = ctx.Queue()
        self.procs = [ctx.Process(target=target, args=(r, world, self.server.port, self.out) + args)
                      for r in range(world)]

    def __enter__(self):
        if self.autostart:
            for p in self.procs:
                p.start()
        return self

    def results(self, n=None, timeout=90):
        return sorted(self.out.get(timeout=timeout) for _ in range(n or len(self.procs)))

    def __exit__(self, *exc):
        for p in self.procs:
            if p.pid is not None:
                p.kill()
                p.join(10)
        self.server.close()


def _ring_main(rank, world, port, out):
    def body():
        store, t = _join(rank, world, port)
        right, left = (rank + 1) % world, (rank - 1) % world
        for seq, (n, dtype) in enumerate(CASES):
            got = np.full(n, 99, dtype)
            fp = Fingerprint("ring", seq, dtype, n)
            t.sendrecv(_payload(rank, n, dtype), right, got, left, fp)
            assert np.array_equal(got, _payload(left, n, dtype)), (n, dtype)
        # Point to point: rank 0 exchanges with everyone in turn, with plain send and recv.
        n, dtype = 1_000_003, "float64"
        for peer in range(1, world):
            fp = Fingerprint("p2p", peer, dtype, n)
            if rank == 0:
                t.send(_payload(0, n, dtype), peer, fp)
                back = np.empty(n, dtype)
                t.recv(back, peer, fp)
                assert np.array_equal(back, _payload(peer, n, dtype))
            elif rank == peer:
                got = np.empty((n,), dtype)
                t.recv(got, 0, fp)
                assert np.array_equal(got, _payload(0, n, dtype))
                t.send(_payload(peer, n, dtype), 0, fp)
        barrier(store, "end", world, rank, 30)
        t.close()
        t.close()
        store.close()
    _report(out, rank, body)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_and_point_to_point_exact(world):
    with _Job(_ring_main, world) as job:
        assert job.results() == [(r, "ok", None) for r in range(world)]


def _mismatch_main(rank, world, port, out):
    def body():
        store, t = _join(rank, world, port)
        x = np.arange(4, dtype=np.float32)
        seen = []
        if rank == 0:
            t.send(x, 1, Fingerprint("all_reduce", 7, "float32", 4))
        else:
            try:
                t.recv(np.empty(4, np.float32), 0, Fingerprint("broadcast", 7, "float32", 4))
            except CollectiveMismatchError as e:
                seen.append((str(e), e.rank, e.peer, e.op, e.seq))
            try:  # the stream is out of step now: it must refuse, not misread
                t.recv(np.empty(4, np.float32), 0, Fingerprint("broadcast", 8, "float32", 4))
            except PeerFailureError as e:
                seen.append(str(e))
        store2, t2 = _join(rank, world, port, prefix="second")
        fp = Fingerprint("all_gather", 3, "float32", 4)
        if rank == 0:
            t2.send(np.arange(5, dtype=np.float32), 1, fp)  # one element too many
        else:
            try:
                t2.recv(np.empty(4, np.float32), 0, fp)
            except CollectiveMismatchError as e:
                seen.append(str(e))
        barrier(store, "end", world, rank, 30)
        t.close(), t2.close(), store.close(), store2.close()
        return seen
    _report(out, rank, body)


def test_mismatched_fingerprints_name_both_sides():
    with _Job(_mismatch_main, 2) as job:
        (_, status0, seen0), (_, status1, seen1) = job.results()
    assert (status0, seen0, status1) == ("ok", [], "ok")
    message, rank, peer, op, seq = seen1[0]
    assert (rank, peer, op, seq) == (1, 0, "broadcast", 7)
    assert "expected broadcast #7" in message and "peer rank 0 sent all_reduce #7" in message
    assert "unusable" in seen1[1]
    assert "expected a 16-byte payload" in seen1[2] and "sent 20 bytes" in seen1[2]


def _victim_main(rank, world, port, out, victim):
    store, t = _join(rank, world, port, timeout=60)
    right, left = (rank + 1) % world, (rank - 1) % world
    n = 1 << 18
    for seq in range(3):
        t.sendrecv(np.ones(n), right, np.empty(n), left, Fingerprint("ring", seq, "float64", n))
    out.put((rank, "ready", None))
    if rank == victim:
        time.sleep(300)  # killed by the test
    def body():
        for seq in range(3, 10_000):
            t.sendrecv(np.ones(n), right, np.empty(n), left,
                       Fingerprint("ring", seq, "float64", n))
    _report(out, rank, body)
    time.sleep(300)  # stay alive, so the only death the others can see is the victim's


@pytest.mark.parametrize("world, victim", [(2, 1), (3, 0), (4, 2)])
def test_killed_peer_is_named_by_every_survivor(world, victim):
    with _Job(_victim_main, world, victim) as job:
        assert [r[1] for r in job.results(world)] == ["ready"] * world
        time.sleep(0.5)  # let the survivors block
        os.kill(job.procs[victim].pid, signal.SIGKILL)
        reports = job.results(world - 1, timeout=10)  # detection well inside 10 s
    for rank, kind, (message, peer) in reports:
        assert kind == "PeerFailureError", (rank, kind, message)
        assert peer == victim and f"peer rank {victim}" in message and "ring #" in message


def _timeout_main(rank, world, port, out):
    store, t = _join(rank, world, port, timeout=1.0)
    if rank == 0:
        def body():
            t.recv(np.empty(3), 1, Fingerprint("reduce", 42, "float64", 3))
        _report(out, rank, body)
        store.set("done", b"1")
    else:
        store.get("done", timeout=60)
        out.put((rank, "ok", None))
    t.close(), store.close()


def test_silent_peer_times_out():
    with _Job(_timeout_main, 2) as job:
        (_, kind0, detail0), (_, kind1, _) = job.results()
    assert kind0 == "CollectiveTimeoutError" and kind1 == "ok"
    message, peer = detail0
    assert peer == 1 and "reduce #42" in message and "1.0 s" in message
    assert "receive from rank 1 (0/24 payload bytes)" in message


def _silent_exchange_main(rank, world, port, out):
    store, t = _join(rank, world, port, timeout=1.0)
    if rank == 0:  # a large exchange: its send moves on the transport's sending thread
        def body():
            n = 1 << 20
            try:
                t.sendrecv(np.ones(n), 1, np.empty(n), 1, Fingerprint("ring", 9, "float64", n))
            finally:
                began = time.monotonic()
                t.close()
                assert time.monotonic() - began < 2.0, "close waited on the sending thread"
        _report(out, rank, body)
        store.set("done", b"1")
    else:
        store.get("done", timeout=60)
        out.put((rank, "ok", None))
        t.close()
    store.close()


def test_silent_peer_of_a_large_exchange_times_out_naming_both_directions():
    with _Job(_silent_exchange_main, 2) as job:
        (_, kind0, detail0), (_, kind1, _) = job.results()
    assert kind0 == "CollectiveTimeoutError" and kind1 == "ok", detail0
    message, peer = detail0
    assert peer == 1 and "ring #9" in message and "1.0 s" in message
    assert "send to rank 1 (" in message and "/8388672 bytes)" in message
    assert "receive from rank 1 (0/8388608 payload bytes)" in message


def _goodbye_main(rank, world, port, out):
    def body():
        store, t = _join(rank, world, port)
        barrier(store, "up", world, rank, 30)
        if rank == 1:
            t.close()  # leaves politely; ranks 0 and 2 carry on between themselves
            barrier(store, "end", world, rank, 30)
            return None
        other = 2 - rank
        for seq in range(20):
            got = np.empty(1000)
            t.sendrecv(_payload(rank, 1000, "float64"), other, got, other,
                       Fingerprint("pair", seq, "float64", 1000))
            assert np.array_equal(got, _payload(other, 1000, "float64"))
        left = None
        if rank == 0:
            try:
                t.recv(np.empty(1), 1, Fingerprint("late", 0, "float64", 1))
            except PeerFailureError as e:
                left = (str(e), e.peer)
        barrier(store, "end", world, rank, 30)
        t.close(), store.close()
        return left
    _report(out, rank, body)


def test_peer_that_closes_politely_does_not_disturb_others():
    with _Job(_goodbye_main, 3) as job:
        results = job.results()
    assert [r[:2] for r in results] == [(0, "ok"), (1, "ok"), (2, "ok")]
    message, peer = results[0][2]
    assert peer == 1 and "left the job" in message


def test_strangers_at_the_listening_port_are_dropped():
    with _Job(_ring_main, 2, autostart=False) as job:
        job.procs[0].start()
        address = job.server.get("tcp/addr/0", timeout=60).decode()
        host, _, port = address.rpartition(":")
        with socket.create_connection((host, int(port)), timeout=10) as stranger:
            with pytest.raises(AuthenticationError):
                client_handshake(stranger, b"not-the-secret", 10)
        with socket.create_connection((host, int(port)), timeout=10) as junk:
            junk.sendall(b"GET / HTTP/1.0\r\n\r\n")
        job.procs[1].start()
        assert job.results() == [(0, "ok", None), (1, "ok", None)]


def test_bad_arguments_raise_before_any_io():
    t = tcp.create(0, 1, None, 5.0, secret=SECRET)
    fp = Fingerprint("x", 0, "float64", 4)
    with pytest.raises(ValueError, match="itself"):
        t.send(np.zeros(4), 0, fp)
    with pytest.raises(ValueError, match=r"peer rank 3 is outside \[0, 1\)"):
        t.recv(np.zeros(4), 3, fp)
    with pytest.raises(ValueError, match="C-contiguous"):
        t.send(np.zeros((4, 4))[:, 1], 0, fp)
    readonly = np.zeros(4)
    readonly.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        t.recv(readonly, 0, fp)
    with pytest.raises(TypeError, match="numpy array"):
        t.send([1.0, 2.0], 0, fp)
    with pytest.raises(ValueError, match="rank 2 is outside"):
        tcp.create(2, 2, None, 5.0, secret=SECRET)
    t.close()
