"""Forged and replayed frames at a running tcp job's store and at a rank's data port.

A stranger sends well-formed frames of our own protocols without the handshake (a store request
that writes a key, a message header with payload for a collective), with length prefixes far
over every limit (2**62-byte values and payloads); or it replays, byte for byte, a genuine
session it recorded on the wire: an operator's store session (handshake, a write, an add) and a
rank's handshake with rank 0, replayed at both ports. Each connection is cut with at most the
server's challenge sent back, nothing replayed or forged takes effect, rank 0 does not admit a
second "rank 1", and the 3-rank job's all-reduces stay exact to the end.

Garbage, pickles, an oversized client-info length and a wrong secret are in
tests/distributed/rendezvous/test_security.py; oversized frames from authenticated store
clients in test_store.py.
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from neural_arch.distributed.rendezvous.store import ADD, SET, TCPStore, encode_request
from neural_arch.distributed.transports.base import Fingerprint, pack_header
from neural_arch.distributed.group.backend_choice import backend_key
from neural_arch.distributed.transports.tcp_mesh import address_key

import fault_injection_job
from dist_harness import free_port

pytestmark = pytest.mark.timeout(120)
JOB = fault_injection_job.__file__
WORLD_SIZE, ELEMENTS = 3, 4096
CHALLENGE = 4 + 32 + 32  # the most a stranger may get back: magic, server nonce, server proof
HUGE = 1 << 62


class Tap:
    """A relay in front of ``target`` that records what each client sends and receives."""

    def __init__(self, target: tuple) -> None:
        self.target, self.sessions = target, []  # [(client->server bytes, server->client)]
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._sockets: list[socket.socket] = [self._listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            sent, received = bytearray(), bytearray()
            self.sessions.append((sent, received))
            self._sockets += [client, server]
            for src, dst, record in ((client, server, sent), (server, client, received)):
                threading.Thread(target=self._pump, args=(src, dst, record), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket, record: bytearray) -> None:
        try:
            while data := src.recv(1 << 16):
                record += data
                dst.sendall(data)
            dst.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def close(self) -> None:
        for sock in self._sockets:
            sock.close()


def _port(address: str) -> int:
    return int(address.rpartition(":")[2])


def _send_and_read_reply(port: int, data: bytes) -> tuple[bytes, bool]:
    """Send ``data`` as a stranger would; return what came back, and whether the server hung up
    (rather than keeping the connection open past a generous wait)."""
    reply = b""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.settimeout(10)
        try:
            sock.sendall(data)
            while chunk := sock.recv(4096):
                reply += chunk
        except ConnectionError:  # cut off with our bytes unread: dropped just the same
            pass
        except socket.timeout:
            return reply, False
    return reply, True


def _assert_dropped(port: int, data: bytes, what: str) -> None:
    reply, hung_up = _send_and_read_reply(port, data)
    assert hung_up and b"NFok" not in reply and len(reply) in (0, CHALLENGE), (what, reply)


def _forged_frames() -> dict:
    header = Fingerprint("all_reduce:sum", 4, "float64", ELEMENTS + 1)
    return {
        "store set": encode_request(SET, b"forged", b"written by a stranger"),
        "store add": encode_request(ADD, b"tapped/count", (100).to_bytes(8, "little", signed=True)),
        # <op, key length, value length, timeout>, then a key and the start of a value
        "store set, oversized": struct.pack("<BIQd", SET, 6, HUGE, 0.0) + b"forged" + b"x" * 64,
        "message header with payload": pack_header(header, 8 * (ELEMENTS + 1))
        + bytes(8 * (ELEMENTS + 1)),
        "message header, oversized": pack_header(header, HUGE) + b"x" * 64,
    }


def _start_rank(rank: int, env: dict, out) -> subprocess.Popen:
    with open(out / f"rank{rank}.log", "wb") as log:
        return subprocess.Popen(
            [sys.executable, JOB, "--out", str(out), "--backend", "tcp", "--elements",
             str(ELEMENTS), "--seconds", "90", "--timeout", "60"],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)


def _wait(predicate, limit: float = 60.0) -> bool:
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_forged_and_replayed_frames_are_dropped_and_the_job_stays_exact(tmp_path):
    port, secret = free_port(), secrets.token_hex(16)
    env = {**os.environ, "WORLD_SIZE": str(WORLD_SIZE), "LOCAL_WORLD_SIZE": str(WORLD_SIZE),
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NEURAL_ARCH_SECRET": secret}
    procs, taps = [_start_rank(0, env, tmp_path)], []
    log = lambda: "\n".join(p.read_text(errors="replace") for p in tmp_path.glob("*.log"))
    try:
        operator = TCPStore("127.0.0.1", port, secret=secret.encode(), timeout=30)
        # The ranks first agree on the backend at the store; the operator stands in for those
        # not started yet, so that rank 0 goes on to open its data port.
        for rank in range(1, WORLD_SIZE):
            operator.set(backend_key(rank), b"tcp")
        data_address = operator.get(address_key("tcp", 0), timeout=30).decode()
        # A genuine store session, recorded on the wire.
        taps.append(Tap(("127.0.0.1", port)))
        tapped = TCPStore("127.0.0.1", _port(taps[0].address), secret=secret.encode(),
                          timeout=30)
        tapped.set("tapped", b"1")
        assert tapped.add("tapped/count", 1) == 1
        tapped.close()
        store_session = bytes(taps[0].sessions[0][0])
        assert len(store_session) > 4 + 32 + 32 + 2, store_session  # a handshake, then requests
        # Rank 1's handshake with rank 0, recorded: rank 1 dials the tap in front of rank 0.
        taps.append(Tap(("127.0.0.1", _port(data_address))))
        operator.set(address_key("tcp", 0), taps[1].address.encode())
        procs.append(_start_rank(1, env, tmp_path))
        assert _wait(lambda: taps[1].sessions and b"NFok" in taps[1].sessions[0][1]), log()
        rank_handshake = bytes(taps[1].sessions[0][0])
        assert struct.pack("<II", 1, WORLD_SIZE) + b"tcp" in rank_handshake  # "I am rank 1"

        for port_name, target in (("store", port), ("data port", _port(data_address))):
            for what, frame in _forged_frames().items():
                _assert_dropped(target, frame, f"forged {what} at the {port_name}")
            _assert_dropped(target, store_session, f"replayed store session at the {port_name}")
            _assert_dropped(target, rank_handshake, f"replayed rank handshake at the {port_name}")

        operator.set(address_key("tcp", 0), data_address.encode())
        procs.append(_start_rank(2, env, tmp_path))
        looping = lambda: all((tmp_path / f"looping_{r}.json").exists() for r in range(3))
        assert _wait(looping), log()
        # Nothing forged or replayed was written.
        assert not operator.check(["forged"]) and operator.get("tapped/count") == b"1"
        operator.close()
        (tmp_path / "stop").touch()
        assert [p.wait(60) for p in procs] == [0] * WORLD_SIZE, log()
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        for tap in taps:
            tap.close()
    assert not list(tmp_path.glob("error_*.json")), log()
    base = np.arange(ELEMENTS, dtype=np.float64) % 1000.0
    for rank in range(WORLD_SIZE):
        done = json.loads((tmp_path / f"done_{rank}.json").read_text())
        assert done["steps"] > 3, done
        assert done["result_sum"] == float((base * 6).sum()), done
