"""Strangers at a running job's ports: garbage, a pickle, an oversized length and a wrong-secret
handshake are dropped at the store and at a rank's data port, nothing they send is unpickled,
and the job's collectives go on giving exact results."""
from __future__ import annotations

import hashlib
import hmac
import json
import os
import pickle
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from neural_arch.distributed.group.backend_choice import backend_key
from neural_arch.distributed.rendezvous.store import TCPStore

import fault_injection_job
from dist_harness import free_port

pytestmark = pytest.mark.timeout(120)
JOB = fault_injection_job.__file__
ELEMENTS = 4096
MAGIC = b"NFa1"


class CreatesMarker:
    """Unpickling this creates the marker file: proof that a payload was unpickled."""

    def __init__(self, path: str) -> None:
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _hello_then(sock: socket.socket, proof: bytes) -> bytes:
    """Send a well-formed hello, read the challenge, answer with ``proof``; return the reply."""
    sock.sendall(MAGIC + secrets.token_bytes(32))
    challenge = _read(sock, 4 + 32 + 32)
    sock.sendall(proof)
    return challenge + _read(sock, 16)


def _wrong_secret_proof(sock: socket.socket) -> bytes:
    client_nonce = secrets.token_bytes(32)
    sock.sendall(MAGIC + client_nonce)
    challenge = _read(sock, 4 + 32 + 32)
    server_nonce = challenge[4:36]
    info_len = struct.pack("<H", 0)
    mac = hmac.new(b"not the job secret", b"neural_arch/client" + client_nonce + server_nonce
                   + info_len, hashlib.sha256).digest()
    sock.sendall(mac + info_len)
    return challenge + _read(sock, 16)


def _read(sock: socket.socket, n: int) -> bytes:
    """Up to ``n`` bytes, stopping early when the other side closes."""
    data = b""
    while len(data) < n:
        try:
            chunk = sock.recv(n - len(data))
        except ConnectionError:
            break
        if not chunk:
            break
        data += chunk
    return data


def _attacks(marker: str):
    evil = pickle.dumps(CreatesMarker(marker))
    garbage = b"\xff\x00GET / HTTP/1.1\r\n" + os.urandom(48)
    return {
        "garbage": lambda s: (s.sendall(garbage), _read(s, 16))[1],
        "raw pickle": lambda s: (s.sendall(evil), _read(s, 16))[1],
        "pickle as proof": lambda s: _hello_then(s, evil + bytes(2048)),
        "oversized length": lambda s: _hello_then(s, bytes(32) + struct.pack("<H", 0xFFFF)
                                                  + b"x" * 64),
        "wrong secret": _wrong_secret_proof,
    }


def _assert_dropped(port: int, marker: str) -> None:
    """Every attack ends with the server closing the connection, never with acceptance."""
    for name, attack in _attacks(marker).items():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
            sock.settimeout(10)
            try:
                reply = attack(sock)
                tail = _read(sock, 1)  # the server must close on us
            except ConnectionError:  # dropped while we were still sending: fine as well
                reply, tail = b"", b""
        assert b"NFok" not in reply and tail == b"", (name, reply)
        assert len(reply) in (0, 4 + 32 + 32), (name, reply)  # at most the challenge


def _start_rank(rank: int, env: dict, out: Path) -> subprocess.Popen:
    log = open(out / f"rank{rank}.log", "wb")
    try:
        return subprocess.Popen(
            [sys.executable, JOB, "--out", str(out), "--backend", "tcp", "--elements",
             str(ELEMENTS), "--seconds", "90"],
            env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    finally:
        log.close()


def _wait(predicate, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.02)
    return predicate()


def test_strangers_are_dropped_and_collectives_stay_exact(tmp_path):
    marker = str(tmp_path / "unpickled.marker")
    port, secret = free_port(), secrets.token_hex(16)
    env = {**os.environ, "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(port), "NEURAL_ARCH_SECRET": secret}
    procs = [_start_rank(0, env, tmp_path)]
    try:
        # Rank 0 waits for rank 1 at its data port; an operator who knows the secret can read
        # where that port is, and strangers get there first. (Before that, the ranks meet at the
        # store to agree on the backend; the operator stands in for rank 1 there.)
        operator = TCPStore("127.0.0.1", port, secret=secret.encode(), timeout=30)
        operator.set(backend_key(1), b"tcp")
        data_port = int(operator.get("tcp/addr/0", timeout=30).decode().rpartition(":")[2])
        _assert_dropped(port, marker)
        _assert_dropped(data_port, marker)
        procs.append(_start_rank(1, env, tmp_path))
        looping = lambda: all((tmp_path / f"looping_{r}.json").exists() for r in (0, 1))
        assert _wait(looping, 60), [p.read_text() for p in tmp_path.glob("*.log")]
        # While the job runs: the store is still open to strangers, the data port is gone.
        _assert_dropped(port, marker)
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(("127.0.0.1", data_port), timeout=5).close()
        operator.close()
        (tmp_path / "stop").touch()
        assert all(p.wait(60) == 0 for p in procs), [p.read_text() for p in tmp_path.glob("*.log")]
    finally:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
    assert not list(tmp_path.glob("error_*.json"))
    base = np.arange(ELEMENTS, dtype=np.float64) % 1000.0
    for rank in (0, 1):
        done = json.loads((tmp_path / f"done_{rank}.json").read_text())
        assert done["steps"] > 3 and done["result_sum"] == float((base * 3).sum()), done
    assert not os.path.exists(marker), "a stranger's pickle was unpickled"
