"""The rendezvous TCPStore: semantics across processes, timeouts, and hostile peers."""
import multiprocessing as mp
import os
import pickle
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest

from neural_arch.distributed.errors import (AuthenticationError, CollectiveTimeoutError,
                                            RendezvousError)
from neural_arch.distributed.rendezvous.auth import client_handshake
from neural_arch.distributed.rendezvous.store import (ADD, GET, SET, TCPStore, barrier,
                                                      claim_rank, encode_request)

pytestmark = pytest.mark.timeout(90)
SECRET = b"store-test-secret"


@pytest.fixture
def server():
    store = TCPStore("127.0.0.1", 0, world_size=4, is_server=True, secret=SECRET, timeout=20)
    yield store
    store.close()


def _client(server, **kwargs):
    kwargs.setdefault("timeout", 20)
    return TCPStore("127.0.0.1", server.port, secret=SECRET, **kwargs)


def _eventually(predicate, within=10.0):
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def test_basic_operations(server):
    client = _client(server)
    try:
        server.set("k", b"v1")
        assert client.get("k") == b"v1"
        client.set("k", bytearray(b"v2"))
        client.set("text", "caf\u00e9")
        assert server.get("k") == b"v2" and server.get("text") == "caf\u00e9".encode()
        assert client.add("n", 5) == 5 and server.add("n", -7) == -2
        assert client.get("n") == b"-2"  # counters are ASCII decimals, as in PyTorch
        assert client.check(["k", "n"]) and not client.check(["k", "absent"])
        assert client.delete_key("k") and not client.delete_key("k")
        assert not client.check("k")
        big = bytes(range(256)) * 4096  # 1 MiB round trip, byte for byte
        client.set("big", big)
        assert server.get("big") == big
        client.set("empty", b"")
        assert server.get("empty") == b""
        client.wait(["n", "big"], timeout=timedelta(seconds=1))
    finally:
        client.close()


def test_bad_arguments(server):
    with pytest.raises(TypeError, match="store keys are str"):
        server.set(b"bytes-key", b"v")
    with pytest.raises(ValueError, match="4097 bytes"):
        server.set("k" * 4097, b"v")
    with pytest.raises(TypeError, match="must be bytes, got int"):
        server.set("k", 3)
    with pytest.raises(TypeError, match="add amount must be an int"):
        server.add("k", 1.5)
    server.set("word", b"hello")
    with pytest.raises(ValueError, match="not an integer"):
        server.add("word", 1)
    with pytest.raises(ValueError, match="port"):
        TCPStore("127.0.0.1", 0, secret=SECRET)  # only a server may ask for port 0
    small = _client(server, max_value_bytes=10)
    try:
        with pytest.raises(ValueError, match="11 bytes; the limit is 10"):
            small.set("k", b"x" * 11)
    finally:
        small.close()


def test_get_and_wait_time_out_naming_key_and_seconds(server):
    with pytest.raises(CollectiveTimeoutError, match=r"get\('missing'\) timed out after 0\.3 s"):
        server.get("missing", timeout=0.3)
    with pytest.raises(CollectiveTimeoutError, match=r"wait\('a,b'\) timed out after 0\.2 s"):
        server.set("a", b"1")
        server.wait(["a", "b"], timeout=0.2)
    assert server.get("a") == b"1"  # the connection is still fine afterwards


def test_get_blocks_until_another_client_sets(server):
    client = _client(server)
    setter = threading.Timer(0.3, lambda: server.set("later", b"x"))
    setter.start()
    try:
        assert client.get("later", timeout=10) == b"x"
    finally:
        setter.cancel()
        client.close()


def _rank_main(port, rank, world, out):
    store = TCPStore("127.0.0.1", port, secret=SECRET, timeout=30)
    try:
        store.set(f"rank/{rank}", f"hello from {rank}".encode())
        total = store.add("counter", rank + 1)
        barrier(store, "b0", world, rank, timeout=30)
        others = {r: store.get(f"rank/{r}").decode() for r in range(world)}
        final = int(store.get("counter"))
        barrier(store, "b1", world, rank, timeout=30)
        out.put((rank, total, others, final))
    finally:
        store.close()


def test_many_processes_rendezvous(server):
    world = 4
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_rank_main, args=(server.port, r, world, out))
             for r in range(world)]
    try:
        for p in procs:
            p.start()
        results = sorted(out.get(timeout=60) for _ in procs)
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    expected_total = sum(range(1, world + 1))
    partial_sums = sorted(total for _, total, _, _ in results)
    assert partial_sums[-1] == expected_total and len(set(partial_sums)) == world
    for rank, _, others, final in results:
        assert others == {r: f"hello from {r}" for r in range(world)}
        assert final == expected_total


def test_barrier_timeout_names_missing_ranks(server):
    with pytest.raises(CollectiveTimeoutError, match=r"ranks \[1, 2\] never arrived"):
        barrier(server, "lonely", 3, 0, timeout=0.3)


def test_a_second_claim_of_a_rank_names_the_rank_the_store_and_the_holder(server):
    first, second = _client(server, rank=1), _client(server, rank=1)
    claim_rank(first, 1)
    claim_rank(second, 2)  # another rank joins as usual
    with pytest.raises(RendezvousError) as info:
        claim_rank(second, 1)  # as another job's rank 1 reaching this store would
    message = str(info.value)
    assert info.value.rank == 1 and info.value.op == "init_process_group"
    assert f"store at 127.0.0.1:{server.port} already has a rank 1" in message
    assert f"pid {os.getpid()} on host" in message
    first.close(), second.close()


def test_port_in_use_is_a_rendezvous_error():
    holder = socket.create_server(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        with pytest.raises(RendezvousError, match=f"127.0.0.1:{port}.*in use"):
            TCPStore("127.0.0.1", port, is_server=True, secret=SECRET, timeout=5)
    finally:
        holder.close()


def test_client_waits_for_a_late_server_then_gives_up_when_none_comes():
    probe = socket.create_server(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    result = {}

    def connect():
        try:
            client = TCPStore("127.0.0.1", port, secret=SECRET, timeout=20)
            result["value"] = client.get("hello")
            client.close()
        except Exception as e:
            result["error"] = e

    t = threading.Thread(target=connect)
    t.start()
    time.sleep(0.5)  # the client is already retrying when the server appears
    late = TCPStore("127.0.0.1", port, is_server=True, secret=SECRET, timeout=20)
    try:
        late.set("hello", b"world")
        t.join(30)
        assert result == {"value": b"world"}
    finally:
        late.close()
    with pytest.raises(RendezvousError, match=f"127.0.0.1:{port} after waiting 0.5 s"):
        TCPStore("127.0.0.1", port, secret=SECRET, timeout=0.5)


def test_wrong_secret_is_refused(server):
    with pytest.raises(AuthenticationError, match="does not know the job secret"):
        TCPStore("127.0.0.1", server.port, secret=b"a-guess-of-the-secret", timeout=5)
    other = _client(server)
    try:
        other.set("after-stranger", b"ok")
        assert server.get("after-stranger") == b"ok"
    finally:
        other.close()


def _authenticated_socket(port):
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    client_handshake(sock, SECRET, 10)
    return sock


def _dropped(sock):
    """True when the server closed this connection (EOF or reset)."""
    sock.settimeout(10)
    try:
        return sock.recv(64) == b""
    except ConnectionResetError:
        return True


HOSTILE = {
    "pickle": pickle.dumps({"__reduce__": "os.system"}),
    "garbage": b"\xff" * 64,
    "oversized value": struct.pack("<BIQd", SET, 1, 1 << 40, 0.0) + b"k",
    "oversized key": struct.pack("<BIQd", GET, 1 << 20, 0, 0.0),
    "nan timeout": struct.pack("<BIQd", GET, 1, 0, float("nan")) + b"k",
    "short add": encode_request(ADD, b"k", b"\x01"),
}


@pytest.mark.parametrize("authenticated", [False, True])
def test_hostile_peers_are_dropped_and_others_keep_working(server, authenticated):
    legit = _client(server)
    try:
        legit.set("before", b"1")
        baseline = server.num_clients
        for name, payload in HOSTILE.items():
            if authenticated:
                sock = _authenticated_socket(server.port)
            else:
                sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
            sock.sendall(payload)
            assert _dropped(sock), name
            sock.close()
            assert legit.add("survived", 1) >= 1
        assert _eventually(lambda: server.num_clients == baseline)
        assert legit.get("before") == b"1" and int(legit.get("survived")) == len(HOSTILE)
    finally:
        legit.close()


def test_server_notices_disconnect_during_blocking_get(server):
    baseline = server.num_clients
    sock = _authenticated_socket(server.port)
    sock.sendall(encode_request(GET, b"never-set", b"", 60.0))
    assert _eventually(lambda: server.num_clients == baseline + 1)
    sock.close()
    assert _eventually(lambda: server.num_clients == baseline)


def test_value_over_server_limit_drops_only_that_client():
    small = TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=10,
                     max_value_bytes=1000)
    roomy = TCPStore("127.0.0.1", small.port, secret=SECRET, timeout=10, max_value_bytes=5000)
    try:
        with pytest.raises(RendezvousError, match="went away"):
            roomy.set("k", b"x" * 2000)
        roomy.set("k", b"x" * 1000)  # reconnects and carries on
        assert small.get("k") == b"x" * 1000
    finally:
        roomy.close()
        small.close()


def test_clients_fail_cleanly_when_the_server_closes():
    srv = TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=10)
    client = TCPStore("127.0.0.1", srv.port, secret=SECRET, timeout=1)
    result = {}

    def blocked_get():
        try:
            client.get("never", timeout=30)
        except Exception as e:
            result["error"] = e

    t = threading.Thread(target=blocked_get)
    t.start()
    time.sleep(0.3)
    srv.close()
    t.join(20)
    assert isinstance(result.get("error"), RendezvousError)
    with pytest.raises(RendezvousError, match=f"127.0.0.1:{srv.port}"):
        client.set("k", b"v")  # reconnecting finds no server within the 1 s timeout
    client.close()
    srv.close()  # closing twice is fine


def test_errors_name_the_rank_that_made_the_request():
    srv = TCPStore("127.0.0.1", 0, is_server=True, secret=SECRET, timeout=10, rank=0)
    client = TCPStore("127.0.0.1", srv.port, secret=SECRET, timeout=1, rank=3)
    with pytest.raises(CollectiveTimeoutError,
                       match=r"^\[rank 3, store\.get\] store get\('missing'\) timed out"):
        client.get("missing", timeout=0.2)
    srv.close()
    with pytest.raises(RendezvousError, match=r"^\[rank 3, store\.set\] store set\('k'\)"):
        client.set("k", b"v")
    with pytest.raises(RendezvousError, match=r"^\[rank 3, store\.set\] store set\('k'\): could "
                                              r"not reach the store at 127\.0\.0\.1:"):
        client.set("k", b"v")  # reconnecting: one prefix, not two
    client.close()
    with pytest.raises(RendezvousError, match=r"^\[rank 5, store\.connect\] could not reach"):
        TCPStore("127.0.0.1", srv.port, secret=SECRET, timeout=0.3, rank=5)
