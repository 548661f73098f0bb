"""Notices between the ranks of an MPI job, beside their traffic: "I am leaving" and "rank R
failed".

A rank whose program ends mid-job sits in ``MPI_Finalize``, alive and not stopped, so neither
the pid watch nor MPI notices that it left; a failure one rank found (a peer that died or left)
reaches ranks that do not talk to that peer only through the ranks that do. Without a store, a
notice is how they hear: a small message to every peer on the transport's communicator, under a
tag of its own so that it never matches a data receive. Every wait loop reads what has arrived
(``poll``) when it looks at its peers' liveness.

A notice is plain bytes (kind, rank, reason in UTF-8); nothing received is unpickled.

A closing rank frees its communicator only once every peer has said that it left (``leave``):
MPI (Open MPI at least) gives a freed communicator's context to the next one made, and a
message that arrives after the free goes to that next communicator. There a late "I am
leaving" would be read as the new transport's, and it also takes a place in MPI's own ordering
of that sender's messages, so that one of the new communicator's real messages is never
delivered (a hang). A token naming the transport in each notice would drop the stale notice
but not give back the lost message: nothing may arrive after the free. A peer's notice that it
left is the last message it sends on the communicator and MPI delivers one sender's messages
in order, so once every peer's is in, nothing more can come. Otherwise (a peer still working,
stopped or dead) the communicator is kept, never freed: a little memory per peer, its context is
not reused, and what arrives late lies unread in it.
"""
from __future__ import annotations

import struct
import time
from typing import Callable, Optional

from .mpi_exit import mark_broken

TAG = 0x4E47
LEFT, FAILED = 1, 2
_HEAD = struct.Struct("<ii")  # kind, the rank it is about
_MAX_REASON_BYTES = 2000
# How long a closing rank waits for its own notices to leave and for every peer's notice that
# it left too (``leave``); ranks that end together close within it, and a later one costs the
# communicator (kept, not freed), never a wrong message.
CLOSE_WAIT_S = 0.5


class Notices:
    """Send and read notices on ``comm`` (the transport's communicator) for rank ``rank``."""

    def __init__(self, mpi, comm, rank: int, world_size: int, kept: list) -> None:
        self._mpi, self._comm, self.rank, self.world_size = mpi, comm, rank, world_size
        self._sends: list = []  # (request, buffer): the buffer lives until the send completes
        # Sends whose Test raised, or still in flight when ``leave`` stopped waiting, with their
        # buffers: appended to ``kept`` (the transport's ``abandoned``, which lives as long as
        # the transport): an error need not end a request, and MPI may still read its bytes.
        self.kept = kept

    def send(self, kind: int, about: int, reason: str = "") -> None:
        """Post ``kind`` about rank ``about`` to every peer; never waits. A notice MPI refuses
        (its peer failed, under fault tolerance) is dropped: that peer cannot hear it, and a
        closing or failing rank must not raise for it. The job is marked broken, as a wait
        that meets a failed peer marks it (``mpi_exit``)."""
        MPI = self._mpi
        data = bytearray(_HEAD.pack(kind, about)
                         + reason.encode("utf-8", "replace")[:_MAX_REASON_BYTES])
        for peer in range(self.world_size):
            if peer != self.rank:
                try:
                    self._sends.append((self._comm.Isend([data, MPI.BYTE], peer, TAG), data))
                except MPI.Exception as e:
                    mark_broken(f"a notice to rank {peer} could not be sent ({e})")
        self._sweep()

    def _sweep(self) -> bool:
        """Let go of the notices whose send completed, keep (``kept``) those whose Test failed
        (their peer cannot hear them); True when none is left in flight."""
        MPI, in_flight = self._mpi, []
        for req, buf in self._sends:
            try:
                if not req.Test():
                    in_flight.append((req, buf))
            except MPI.Exception:
                self.kept.append((req, buf))
        self._sends = in_flight
        return not in_flight

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

    def leave(self, peers_left: Optional[Callable[[], set]],
              peer_died: Callable[[], bool]) -> bool:
        """Tell every peer this rank leaves, then wait (at most ``CLOSE_WAIT_S``) for the
        notices to leave and every peer to have left too. True: every peer had left, so the
        communicator may be freed (see the module's text). ``peers_left`` reads the notices
        and returns the peers known to have left; None: another thread may be reading them,
        so this rank only sends (and keeps the communicator). ``peer_died``: whether a peer
        died, so that its notice will never come (the wait ends, the communicator is kept)."""
        self.send(LEFT, self.rank)
        everyone = set(range(self.world_size)) - {self.rank}
        deadline = time.monotonic() + CLOSE_WAIT_S
        all_left = False
        MPI = self._mpi
        while True:
            sent = self._sweep()
            try:
                all_left = peers_left is not None and everyone <= peers_left()
            except MPI.Exception:  # a failed peer's notice: it will never say it left
                peers_left = None
            waiting_for_peers = peers_left is not None and not all_left and not peer_died()
            if (sent and not waiting_for_peers) or time.monotonic() >= deadline:
                break
            time.sleep(1e-3)
        self.kept += self._sends  # still in flight: MPI may read their bytes after this
        self._sends = []
        return all_left
