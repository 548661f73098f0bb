"""Shared-memory transport: point-to-point messages between real rank processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from contextlib import closing

import numpy as np
import pytest

from neural_arch.distributed.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                            DistributedError, PeerFailureError)
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.base import Fingerprint
from neural_arch.distributed.transports.shm.layout import ShmLayout
from neural_arch.distributed.transports.shm.waiting import pid_alive
from shm_testing import errors_of, kill_self, run_ranks, shm_names_of

pytestmark = pytest.mark.timeout(180)

SMALL_SLOTS = {"slots": 2, "slot_bytes": 4096}  # messages of a few KiB wrap the ring many times


def payload(src: int, dst: int, n: int, dtype) -> np.ndarray:
    return ((np.arange(n, dtype=np.int64) * 31 + src * 1000 + dst * 7) % 2000 - 1000).astype(dtype)


def ring_exchange(rank, p, store, sizes, options):
    t = shm.create(rank, p, store, 60.0, **options)
    bad = []
    try:
        nxt, prv = (rank + 1) % p, (rank - 1) % p
        for seq, (n, dtype) in enumerate(sizes):
            fp = Fingerprint("ring", seq, np.dtype(dtype).name, n)
            out = np.full(n, 77, dtype)
            t.sendrecv(payload(rank, nxt, n, dtype), nxt, out, prv, fp)
            if not np.array_equal(out, payload(prv, rank, n, dtype)):
                bad.append((n, np.dtype(dtype).name))
        return bad
    finally:
        t.close()


RING_SIZES = [(0, np.float32), (1, np.float64), (3, np.int32), (1023, np.float16),
              (4096, np.uint8), (5000, np.int64), (70_001, np.float32), (2_000_003, np.float64)]


@pytest.mark.parametrize("p,options", [(1, {}), (2, {}), (3, SMALL_SLOTS), (4, {}),
                                       (4, SMALL_SLOTS)])
def test_sendrecv_ring_is_exact(tmp_path, p, options):
    sizes = RING_SIZES if options else RING_SIZES[:-1] + [(300_007, np.float64)]
    results = run_ranks(p, ring_exchange, sizes, options, store_dir=str(tmp_path), timeout=150)
    for r in results:
        assert r.ok, r
        assert r.value == [], f"rank {r.rank} received wrong data for {r.value}"
    assert shm_names_of(r.pid for r in results) == []


def fan_out_fan_in(rank, p, store, rounds):
    """Rank 0 sends every other rank its own messages, then receives one back from each."""
    t = shm.create(rank, p, store, 60.0, **SMALL_SLOTS)
    bad = []
    try:
        for k in range(rounds):
            n = 1 + 977 * k
            for peer in range(1, p):
                fp = Fingerprint("p2p", k, "int64", n)
                if rank == 0:
                    t.send(payload(0, peer, n, np.int64), peer, fp)
                elif rank == peer:
                    got = np.empty(n, np.int64)
                    t.recv(got, 0, fp)
                    bad += [] if np.array_equal(got, payload(0, peer, n, np.int64)) else [(k, n)]
            for peer in range(1, p):
                fp = Fingerprint("p2p-back", k, "int32", n)
                if rank == 0:
                    got = np.empty(n, np.int32)
                    t.recv(got, peer, fp)
                    bad += [] if np.array_equal(got, payload(peer, 0, n, np.int32)) else [(k, n)]
                elif rank == peer:
                    t.send(payload(peer, 0, n, np.int32), 0, fp)
        return bad
    finally:
        t.close()


@pytest.mark.parametrize("p", [2, 4])
def test_send_recv_sequences_are_exact(tmp_path, p):
    results = run_ranks(p, fan_out_fan_in, 12, store_dir=str(tmp_path), timeout=150)
    for r in results:
        assert r.ok, r
        assert r.value == []


def mismatch_p2p(rank, p, store, kind):
    with closing(shm.create(rank, p, store, 30.0)) as t:
        if rank == 0:
            n = 6 if kind == "size" else 5
            t.send(np.ones(n, np.float32), 1, Fingerprint("all_reduce", 3, "float32", 5))
            return "sent"
        fp = Fingerprint("broadcast" if kind == "op" else "all_reduce", 3, "float32", 5)
        t.recv(np.empty(5, np.float32), 0, fp)
        return "received"


@pytest.mark.parametrize("kind", ["op", "size"])
def test_mismatched_header_raises_naming_both_sides(tmp_path, kind):
    results = run_ranks(2, mismatch_p2p, kind, store_dir=str(tmp_path), timeout=60)
    assert results[0].ok and results[0].value == "sent"
    err = results[1]
    assert err.error == CollectiveMismatchError.__name__, err
    assert err.peer == 0 and "rank 1" in err.message and "peer rank 0" in err.message
    if kind == "op":
        assert "broadcast #3" in err.message and "all_reduce #3" in err.message
    else:
        assert "20-byte" in err.message and "24 bytes" in err.message


def recv_never_sent(rank, p, store):
    t = shm.create(rank, p, store, 30.0)
    t.timeout = 0.5  # after the rendezvous, which may be slow on a loaded machine
    try:
        if rank == 1:
            try:
                t.recv(np.empty(3, np.float32), 0, Fingerprint("recv_test", 11, "float32", 3))
            finally:
                store.set("recv_ended", b"1")
            return "received"
        store.get("recv_ended", timeout=30.0)  # alive, never sends, until rank 1's recv ended
        return "idle"
    finally:
        t.close()


def test_recv_timeout_names_rank_peer_op_seq(tmp_path):
    results = run_ranks(2, recv_never_sent, store_dir=str(tmp_path), timeout=60)
    err = results[1]
    assert err.error == CollectiveTimeoutError.__name__, err
    for part in ("rank 1", "recv_test #11", "peer rank 0"):
        assert part in err.message


def ring_then_die(rank, p, store, victim_closes):
    t = shm.create(rank, p, store, 60.0)
    try:
        nxt, prv = (rank + 1) % p, (rank - 1) % p
        buf = np.zeros(10, np.float32)
        t.sendrecv(np.ones(10, np.float32), nxt, buf, prv, Fingerprint("ring", 0, "f", 10))
        if rank == 2:
            if victim_closes:
                t.close()
                for survivor in (0, 1):  # alive, closed, until both survivors' calls ended
                    store.get(f"ended{survivor}", timeout=30.0)
                return "closed"
            kill_self()
        # a big message cannot fit the ring, so the sender to rank 2 blocks as well
        big = np.ones(5_000_000, np.float32)
        try:
            t.sendrecv(big, nxt, np.empty_like(big), prv, Fingerprint("ring", 1, "f", big.size))
        finally:
            store.set(f"ended{rank}", b"1")
        return "no error"
    finally:
        t.close()


@pytest.mark.parametrize("victim_closes", [False, True])
def test_dead_or_closed_peer_raises_peer_failure(tmp_path, victim_closes):
    results = run_ranks(3, ring_then_die, victim_closes, store_dir=str(tmp_path), timeout=100)
    for r in (results[0], results[1]):
        # the transport timeout is 60 s: a PeerFailureError comes from the liveness watch
        assert r.error == PeerFailureError.__name__, r
        assert r.peer == 2 and "peer rank 2" in r.message
        assert ("closed" in r.message) == victim_closes
    assert shm_names_of(r.pid for r in results) == []


def bad_calls(rank, p, store):
    t = shm.create(rank, p, store, 30.0)
    fp = Fingerprint("x", 0, "float32", 2)
    calls = [
        lambda: t.send([1.0], 1 - rank, fp),
        lambda: t.send(np.ones((2, 2)), 1 - rank, fp),
        lambda: t.recv(np.ones(4)[::2], 1 - rank, fp),
        lambda: t.recv(np.frombuffer(b"12345678", np.float32), 1 - rank, fp),
        lambda: t.send(np.ones(2), p, fp),
        lambda: t.send(np.ones(2), rank, fp),
        lambda: t.sendrecv(np.ones(2), -1, np.ones(2), 0, fp),
    ]
    try:
        found = errors_of(calls)
    finally:
        t.close()
    try:
        t.send(np.ones(2), 1 - rank, fp)
        found.append("no error")
    except DistributedError as e:
        found.append(f"DistributedError: {e}")
    return found


def test_bad_arguments_and_closed_transport(tmp_path):
    results = run_ranks(2, bad_calls, store_dir=str(tmp_path), timeout=60)
    for r in results:
        assert r.ok, r
        kinds = [m.split(":")[0] for m in r.value]
        assert kinds == ["TypeError", "ValueError", "ValueError", "ValueError", "ValueError",
                         "ValueError", "ValueError", "DistributedError"], r.value
        assert "(2, 2)" in r.value[1] and "writable" in r.value[3]
        assert "outside 0..1" in r.value[4] and "itself" in r.value[5]
        assert "closed" in r.value[7]


def test_sendrecv_to_itself_copies(tmp_path):
    def body(rank, p, store):
        t = shm.create(rank, p, store, 10.0)
        try:
            out = np.empty(5, np.int64)
            t.sendrecv(np.arange(5), 0, out, 0, Fingerprint("self", 0, "int64", 5))
            return out.tolist()
        finally:
            t.close()
    results = run_ranks(1, body, store_dir=str(tmp_path), timeout=30)
    assert results[0].ok and results[0].value == [0, 1, 2, 3, 4]


def test_create_rejects_bad_arguments():
    for kwargs, message in (({"rank": 2, "world_size": 2}, "rank 2 is outside"),
                            ({"rank": -1, "world_size": 2}, "rank -1 is outside"),
                            ({"rank": 0, "world_size": 0}, "got 0"),
                            ({"rank": 0, "world_size": 2, "timeout": 0}, "got 0")):
        with pytest.raises(ValueError, match=message):
            shm.create(**{"store": None, "timeout": 1.0, **kwargs})
    with pytest.raises(ValueError, match="slots"):
        ShmLayout(2, 0, 4096, 4096)


def test_layout_regions_do_not_overlap():
    layout = ShmLayout(3, 2, 5000, 10_000)
    assert layout.slot_bytes == 8192 and layout.workspace_bytes == 12_288
    regions = [(layout.rank_header(r, h), 128) for r in range(3) for h in (0, 1)]
    regions += [(layout.slot_header(s, d, k), 128) for s in range(3) for d in range(3)
                for k in range(2)]
    regions += [(layout.slot_data(s, d, k), 8192) for s in range(3) for d in range(3)
                for k in range(2)]
    regions += [(layout.ws_input(h, r), 12_288) for h in (0, 1) for r in range(3)]
    regions += [(layout.ws_result(h), 12_288) for h in (0, 1)]
    words = [layout.rank_word(r, f) for r in range(3) for f in range(7)]
    words += [layout.written_word(s, d) for s in range(3) for d in range(3)]
    words += [layout.read_word(s, d) for s in range(3) for d in range(3)]
    assert len(set(words)) == len(words) and max(words) * 8 < layout.rank_headers_at
    regions.sort()
    for (a, size), (b, _) in zip(regions, regions[1:]):
        assert a + size <= b
    assert regions[-1][0] + regions[-1][1] == layout.total_bytes
    assert all(layout.slot_data(s, d, 0) % 4096 == 0 for s in range(3) for d in range(3))


def test_pid_alive_sees_zombies_and_reaped_children():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 30
    while pid_alive(child.pid) and time.monotonic() < deadline:
        time.sleep(0.01)  # exited but not reaped: a zombie, which counts as dead
    assert not pid_alive(child.pid)
    assert child.wait(10) == 0
    assert not pid_alive(child.pid)
    assert pid_alive(os.getpid())


def ring_over_tcp_store(rank, p, _unused_store, port, secret):
    from neural_arch.distributed.rendezvous.store import TCPStore
    store = TCPStore("127.0.0.1", port, world_size=p, secret=secret, timeout=30.0)
    try:
        return ring_exchange(rank, p, store, [(5, np.float64), (70_001, np.int32)], {})
    finally:
        store.close()


def test_rendezvous_through_the_tcp_store(tmp_path):
    from neural_arch.distributed.rendezvous import store as store_module
    secret = os.urandom(32)
    server = store_module.TCPStore("127.0.0.1", 0, world_size=3, is_server=True, secret=secret,
                                   timeout=30.0)
    try:
        results = run_ranks(3, ring_over_tcp_store, server.port, secret,
                            store_dir=str(tmp_path), timeout=90)
    finally:
        server.close()
    for r in results:
        assert r.ok, r
        assert r.value == []
