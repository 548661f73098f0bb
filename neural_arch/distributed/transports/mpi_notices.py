"""Notices between the ranks of an MPI job, beside their traffic: "I am leaving" and "rank R
failed".

A rank whose program ends mid-job sits in ``MPI_Finalize``, alive and not stopped, so neither
the pid watch nor MPI notices that it left; a failure one rank found (a peer that died or left)
reaches ranks that do not talk to that peer only through the ranks that do. Without a store, a
notice is how they hear: a small message to every peer on the transport's communicator, under a
tag of its own so that it never matches a data receive. Every wait loop reads what has arrived
(``poll``) when it looks at its peers' liveness.

A notice is plain bytes (kind, rank, reason in UTF-8); nothing received is unpickled.
"""
from __future__ import annotations

import struct
import time

TAG = 0x4E47
LEFT, FAILED = 1, 2
_HEAD = struct.Struct("<ii")  # kind, the rank it is about
_MAX_REASON_BYTES = 2000
_CLOSE_WAIT_S = 0.5  # for the last notices to leave before the communicator is freed


class Notices:
    """Send and read notices on ``comm`` (the transport's communicator) for rank ``rank``."""

    def __init__(self, mpi, comm, rank: int, world_size: int) -> None:
        self._mpi, self._comm, self.rank, self.world_size = mpi, comm, rank, world_size
        self._sends: list = []  # (request, buffer): the buffer lives until the send completes

    def send(self, kind: int, about: int, reason: str = "") -> None:
        """Post ``kind`` about rank ``about`` to every peer; never waits."""
        data = bytearray(_HEAD.pack(kind, about)
                         + reason.encode("utf-8", "replace")[:_MAX_REASON_BYTES])
        for peer in range(self.world_size):
            if peer != self.rank:
                self._sends.append((self._comm.Isend([data, self._mpi.BYTE], peer, TAG), data))
        self._sends = [(req, buf) for req, buf in self._sends if not req.Test()]

    def poll(self) -> list:
        """The notices that have arrived, oldest first, as (sender, kind, rank, reason)."""
        MPI, got = self._mpi, []
        status = MPI.Status()
        while self._comm.Iprobe(MPI.ANY_SOURCE, TAG, status):
            source, n = status.Get_source(), status.Get_count(MPI.BYTE)
            buf = bytearray(n)
            self._comm.Recv([buf, MPI.BYTE], source, TAG)
            if n < _HEAD.size:
                continue  # not one of ours: ignore rather than misread
            kind, about = _HEAD.unpack_from(buf)
            got.append((source, kind, about, bytes(buf[_HEAD.size:]).decode("utf-8", "replace")))
        return got

    def finish(self) -> None:
        """Let the notices posted here leave (bounded): the communicator is freed next."""
        deadline = time.monotonic() + _CLOSE_WAIT_S
        reqs = [req for req, _ in self._sends]
        while reqs and not self._mpi.Request.Testall(reqs) and time.monotonic() < deadline:
            time.sleep(1e-3)
        self._sends = []
