"""An in-process Transport over threads and queues, for fast tests of the collective algorithms.

Sends are synchronous (a send returns only once the receiver has taken the message), which is
the strictest behaviour a real transport may have: an algorithm that only works when sends are
buffered deadlocks here instead of passing by luck. Headers are packed and checked exactly as
the real transports do, and every payload size is recorded so tests can check segmentation.
"""
from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable

import numpy as np

from neural_arch.distributed.errors import CollectiveTimeoutError, PeerFailureError
from neural_arch.distributed.transports.base import (
    Fingerprint, Transport, check_header, pack_header, unpack_header)

_POLL = 0.02


class Fabric:
    """The wires between ``world_size`` threaded ranks."""

    def __init__(self, world_size: int, timeout: float = 10.0) -> None:
        self.world_size = world_size
        self.timeout = timeout
        self.wires = {(s, d): queue.Queue() for s in range(world_size) for d in range(world_size)}
        self.dead: set[int] = set()
        self.payload_sizes: list[int] = []
        self._lock = threading.Lock()

    def transports(self) -> list["ThreadedTransport"]:
        return [ThreadedTransport(self, r) for r in range(self.world_size)]

    def kill(self, rank: int) -> None:
        self.dead.add(rank)

    def record(self, nbytes: int) -> None:
        with self._lock:
            self.payload_sizes.append(nbytes)


class ThreadedTransport(Transport):
    name = "threaded"

    def __init__(self, fabric: Fabric, rank: int) -> None:
        super().__init__(rank, fabric.world_size, fabric.timeout)
        self.fabric = fabric

    def _check_peer(self, peer: int, fp: Fingerprint, deadline: float) -> None:
        if peer in self.fabric.dead:
            raise PeerFailureError("peer is gone", rank=self.rank, peer=peer, op=fp.op, seq=fp.seq)
        if time.monotonic() > deadline:
            raise CollectiveTimeoutError(f"no progress within {self.timeout} s", rank=self.rank,
                                         peer=peer, op=fp.op, seq=fp.seq)

    def _post(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> threading.Event:
        if not 0 <= dst < self.world_size or dst == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to rank {dst} of {self.world_size}")
        if not buf.flags.c_contiguous or buf.ndim != 1:
            raise ValueError(f"buffers must be 1-D contiguous, got shape {buf.shape}")
        taken = threading.Event()
        self.fabric.record(buf.nbytes)
        self.fabric.wires[(self.rank, dst)].put((pack_header(fp, buf.nbytes), buf.tobytes(), taken))
        return taken

    def _await(self, taken: threading.Event, dst: int, fp: Fingerprint) -> None:
        deadline = time.monotonic() + self.timeout
        while not taken.wait(_POLL):
            self._check_peer(dst, fp, deadline)

    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        self._await(self._post(buf, dst, fp), dst, fp)

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        if not 0 <= src < self.world_size or src == self.rank:
            raise ValueError(f"rank {self.rank} cannot receive from rank {src} of "
                             f"{self.world_size}")
        wire = self.fabric.wires[(src, self.rank)]
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                header, payload, taken = wire.get(timeout=_POLL)
                break
            except queue.Empty:
                self._check_peer(src, fp, deadline)
        got, nbytes = unpack_header(header)
        check_header(fp, got, nbytes, buf.nbytes, rank=self.rank, peer=src)
        buf[...] = np.frombuffer(payload, dtype=buf.dtype)
        taken.set()

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        taken = self._post(sendbuf, dst, fp)
        self.recv(recvbuf, src, fp)
        self._await(taken, dst, fp)

    def close(self) -> None:
        self.fabric.kill(self.rank)


def batched_send_recv_many(self: ThreadedTransport, sends, recvs) -> None:
    """A ``send_recv_many`` for ``ThreadedTransport`` (which has none of its own, so the ring
    keeps to one piece a call): every send posted before the receives, as a transport that
    batches does; patch it in to run the ring's windows of pieces."""
    posted = [(self._post(buf, dst, f), dst, f) for buf, dst, f in sends]
    for buf, src, f in recvs:
        self.recv(buf, src, f)
    for taken, dst, f in posted:
        self._await(taken, dst, f)


def run_threads(world_size: int, fn: Callable[[Transport], Any], timeout: float = 30.0,
                fabric: Fabric | None = None) -> list[Any]:
    """Run ``fn(transport)`` on one thread per rank; results in rank order, first error raised."""
    fabric = fabric or Fabric(world_size, timeout=min(timeout, 10.0))
    transports = fabric.transports()
    results: list[Any] = [None] * world_size
    errors: list[tuple[int, BaseException]] = []

    def body(rank: int) -> None:
        try:
            results[rank] = fn(transports[rank])
        except BaseException as exc:  # reported to the caller below
            errors.append((rank, exc))
            fabric.kill(rank)

    threads = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(world_size)]
    for th in threads:
        th.start()
    deadline = time.monotonic() + timeout
    for th in threads:
        th.join(max(0.0, deadline - time.monotonic()))
    if any(th.is_alive() for th in threads):
        for r in range(world_size):
            fabric.kill(r)
        raise TimeoutError(f"threaded ranks did not finish within {timeout} s")
    if errors:
        raise errors[0][1]  # the first failure is the cause; later ones are its echoes
    return results
