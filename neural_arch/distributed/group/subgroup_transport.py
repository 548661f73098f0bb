"""Transports of groups smaller than the world, built over the world's transport."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..transports.base import Fingerprint, Transport


class GroupTransport(Transport):
    """A subgroup's view of the world transport: group ranks in, global ranks out."""

    def __init__(self, world: Transport, ranks: Sequence[int], rank: int) -> None:
        super().__init__(rank, len(ranks), world.timeout)
        self.world, self.ranks = world, tuple(ranks)
        self.name = world.name

    def global_rank(self, rank: int) -> int:
        return self.world.global_rank(self.ranks[rank])

    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        self.world.send(buf, self.ranks[dst], fp)

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        self.world.recv(buf, self.ranks[src], fp)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        self.world.sendrecv(sendbuf, self.ranks[dst], recvbuf, self.ranks[src], fp)

    def send_recv_many(self, sends, recvs) -> None:
        self.world.send_recv_many([(buf, self.ranks[p], fp) for buf, p, fp in sends],
                                  [(buf, self.ranks[p], fp) for buf, p, fp in recvs])

    def close(self) -> None:
        """The world transport belongs to the default group, which closes it."""


class SoloTransport(Transport):
    """The transport of a one-rank group: every collective is local, there is no peer."""

    name = "solo"

    def __init__(self, timeout: float) -> None:
        super().__init__(0, 1, timeout)

    def _no_peer(self, peer: int) -> None:
        raise ValueError(f"a one-rank group has no peer rank {peer}")

    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        self._no_peer(dst)

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        self._no_peer(src)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        self._no_peer(dst)

    def send_recv_many(self, sends, recvs) -> None:
        for _, peer, _ in list(sends) + list(recvs):
            self._no_peer(peer)

    def close(self) -> None:
        """Nothing to release."""
