"""TCP transport: a full mesh of authenticated sockets, one per pair of ranks.

Setup (``tcp_mesh``): every rank publishes its listening address in the store, dials every
lower rank and accepts every higher one; each connection starts with the mutual handshake.

Data: sockets are non-blocking and one poll loop drives every send and receive of a call, so
``sendrecv`` is full duplex and a ring of any size never deadlocks. Payloads move with
``sendmsg``/``recv_into`` straight from and into the arrays (no copies in Python). A call that
sends a large message while it receives hands its sends to the transport's sending thread
(``tcp_sender``), so both directions of a socket move at once. While it waits, the loop also
watches the other peers' sockets, so the death of any rank surfaces within a poll interval,
naming that rank. ``close`` sends a goodbye header first: a rank that finished is told apart
from one that crashed. What moves one message through its socket, checks its header and
tells a dead peer from one that left is ``tcp_streams``.

``send_recv_chained`` lets a receive queue further sends the moment it completes: with it, a
job of two ranks runs its collectives as pipelines in one loop each (``tcp_pair``, the
transport's ``native_collectives``).
"""
from __future__ import annotations

import os
import select
import socket
import threading
import time
from typing import Optional, Sequence

import numpy as np

from ..health import heartbeat
from ..errors import CollectiveTimeoutError, PeerFailureError
from .base import Fingerprint, Message, Transport, check_job, pack_header
from .tcp_mesh import build_mesh
from .tcp_messages import ChainedRecv, Recv as _Recv, Send as _Send, byte_view as _byte_view
from .tcp_messages import heads as _heads
from .tcp_pair import PairCollectives
from .tcp_sender import SendWorker
from .tcp_streams import PeerStreams, send_goodbye

_POLL_SLICE_S = 0.1  # how soon a wait notices a failure the heartbeat declared
# A call that finds nothing to move polls its sockets again, yielding the core between polls,
# for this long after its last progress before it sleeps in ``poll``: a process asleep there
# is woken tens of microseconds after its message arrives, several times what a small message
# takes on a loopback socket. Measured at p = 2 on two cores (``bench_collectives.py``, the
# trees in turns): the 4-byte all-reduce took 53 us against 93-97 sleeping at once, the
# broadcast 107-111 against 186-192, the 64 KiB all-reduce 130-138 against 205-212; at p = 4
# (ranks outnumbering cores, where the yield hands the core to a peer) 325-343 against 422-439.
# Not while the sending thread moves a large send: polling beside it took the 16 MiB
# all-reduce from 21.4-21.5 ms to 23.8-25.3.
SPIN_S = 1e-4
THREADED_SEND_BYTES = 64 * 1024  # a send this large beside a receive goes to ``tcp_sender``
_IN, _OUT = select.POLLIN | select.POLLPRI, select.POLLOUT


def create(rank: int, world_size: int, store, timeout: float, secret: Optional[bytes] = None,
           host: Optional[str] = None, prefix: str = "tcp") -> "TcpTransport":
    return TcpTransport(rank, world_size, store, timeout, secret=secret, host=host, prefix=prefix)


class TcpTransport(PeerStreams, Transport):
    name = "tcp"

    def __init__(self, rank: int, world_size: int, store, timeout: float,
                 secret: Optional[bytes] = None, host: Optional[str] = None,
                 prefix: str = "tcp") -> None:
        check_job(rank, world_size, timeout)
        super().__init__(rank, world_size, float(timeout))
        self._socks: dict[int, socket.socket] = (
            build_mesh(rank, world_size, store, self.timeout, secret=secret, host=host,
                       prefix=prefix) if world_size > 1 else {})
        self._unusable: dict[int, str] = {}  # peer -> why its stream can no longer be used
        self._lock = threading.Lock()
        self._pair = PairCollectives(self) if world_size == 2 else None
        self._worker: Optional[SendWorker] = None

    def native_collectives(self) -> Optional[PairCollectives]:
        """Two ranks: the pipelined collectives of ``tcp_pair`` (chosen by default); more: none,
        the portable algorithms run."""
        return self._pair

    # ---- data path ---------------------------------------------------------------------------
    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        payload = _byte_view(buf, False, "send")
        self._check_peer(dst, fp)
        self._run([_Send(dst, pack_header(fp, payload.nbytes), payload, fp)], [], fp)

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        payload = _byte_view(buf, True, "recv")
        self._check_peer(src, fp)
        self._run([], [_Recv(src, payload)], fp)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        out, into = _byte_view(sendbuf, False, "send"), _byte_view(recvbuf, True, "recv")
        self._check_peer(dst, fp)
        self._check_peer(src, fp)
        self._run([_Send(dst, pack_header(fp, out.nbytes), out, fp)], [_Recv(src, into)], fp)

    def send_recv_many(self, sends, recvs) -> None:
        """A batch in one poll loop (``_run``): every socket moves as soon as it can."""
        self._chained(sends, [(buf, src, fp, None) for buf, src, fp in recvs])

    def send_recv_chained(self, sends: Sequence[Message], recvs: Sequence[ChainedRecv]) -> None:
        """``send_recv_many`` whose receives may each carry a follow-up: ``recvs`` are
        ``(buf, src, fp, then)``, and ``then`` (or None) runs as soon as that receive is
        complete, in the loop that moves every message, and returns messages to send after
        those already queued. A pipeline: reduce piece k and send it on while the kernel
        delivers piece k + 1 (``tcp_pair``)."""
        self._chained(sends, recvs)

    def _chained(self, sends: Sequence[Message], recvs: Sequence[ChainedRecv]) -> None:
        # (the public entry points are wrapped by ``sent_bytes``: they must not call each other)
        out = [self._outgoing(buf, dst, fp) for buf, dst, fp in sends]
        into = []
        for buf, src, fp, then in recvs:
            payload = _byte_view(buf, True, "recv")
            self._check_peer(src, fp)
            into.append(_Recv(src, payload, fp, then))
        if out or into:
            self._run(out, into, (out or into)[0].fp)

    def _outgoing(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> _Send:
        payload = _byte_view(buf, False, "send")
        self._check_peer(dst, fp)
        return _Send(dst, pack_header(fp, payload.nbytes), payload, fp)

    def _check_peer(self, peer: int, fp: Fingerprint) -> None:
        self.check_peer_rank(peer, fp)
        if peer in self._unusable:
            raise PeerFailureError(f"connection unusable: {self._unusable[peer]}",
                                   rank=self.rank, peer=peer, op=fp.op, seq=fp.seq)
        if peer not in self._socks:
            raise PeerFailureError("transport is closed", rank=self.rank, peer=peer, op=fp.op,
                                   seq=fp.seq)

    def _run(self, sends: list[_Send], recvs: list[_Recv], fp: Fingerprint) -> None:
        with self._lock:
            deadline = time.monotonic() + self.timeout
            known_alive: set[int] = set()  # bystanders with data queued for a later call
            # large sends beside receives move on the sending thread (``tcp_sender``)
            worker = self._sender() if recvs and any(
                s.total >= THREADED_SEND_BYTES for s in sends) else None
            if worker is not None:
                worker.begin(sends)
            try:
                progress = time.monotonic()
                while True:
                    # one stream per peer: only the first pending message to (from) a peer moves
                    moved = any([self._pump_recv(r, r.fp or fp) for r in _heads(recvs)] +
                                [self._pump_send(s) for s in
                                 (_heads(sends) if worker is None else ())])
                    for r in recvs:  # a finished receive's follow-up, before the next one
                        if r.then is not None and r.done:
                            follow, r.then = r.then, None
                            queued = [self._outgoing(*m) for m in follow()]
                            if worker is None:
                                sends += queued
                            else:
                                worker.add(queued)
                    recvs = [r for r in recvs if not r.done]
                    if worker is None:
                        sends = [s for s in sends if s.views]
                    else:
                        worker.check()
                        sends = [] if worker.idle() else worker.ops
                    if not sends and not recvs:
                        return
                    if moved:
                        progress = time.monotonic()
                    elif worker is None and time.monotonic() - progress < SPIN_S:
                        os.sched_yield()
                    else:
                        self._wait(sends, recvs, known_alive, deadline, fp, worker)
            except BaseException as e:
                if worker is not None:
                    worker.cancel()
                    sends = worker.ops
                for op in sends + recvs:  # a half-moved message leaves the stream unusable
                    self._unusable.setdefault(op.peer, f"{type(e).__name__} in {fp.describe()}")
                raise

    def _wait(self, sends, recvs, known_alive: set[int], deadline: float, fp: Fingerprint,
              worker: Optional[SendWorker]) -> None:
        """Sleep until a pending socket is ready (or the sending thread finished or failed);
        meanwhile watch every other peer for death."""
        heartbeat.check(self.rank, fp.op, fp.seq)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            if worker is not None:  # its sends stop moving before they are reported
                worker.cancel()
            raise self._timeout_error(sends, recvs, fp)
        masks: dict[int, int] = {}
        for op, mask in ([(s, _OUT) for s in _heads(sends) if worker is None] +
                         [(r, _IN) for r in _heads(recvs)]):
            masks[op.peer] = masks.get(op.peer, 0) | mask
        watched = {p for p in self._socks
                   if p not in masks and p not in known_alive and p not in self._unusable}
        for peer in watched:
            masks[peer] = _IN
        poller = select.poll()
        by_fd = {}
        for peer, mask in masks.items():
            by_fd[self._socks[peer].fileno()] = peer
            poller.register(self._socks[peer], mask)
        if worker is not None:
            poller.register(worker.wake_fd, _IN)
        for fd, _ in poller.poll(max(1, int(min(remaining, _POLL_SLICE_S) * 1000))):
            peer = by_fd.get(fd)
            if peer is None:
                worker.drain()
            elif peer in watched and self._bystander_settled(peer, fp):
                known_alive.add(peer)

    def _timeout_error(self, sends, recvs, fp: Fingerprint) -> CollectiveTimeoutError:
        parts = [f"send to rank {s.peer} ({s.total - sum(v.nbytes for v in s.views)}/{s.total} "
                 "bytes)" for s in sends]
        parts += [f"receive from rank {r.peer} ({r.got}/{r.payload.nbytes} payload bytes)"
                  for r in recvs]
        first = (sends or recvs)[0].peer
        return CollectiveTimeoutError(f"{fp.describe()} did not complete within {self.timeout} s;"
                                      f" pending: {', '.join(parts)}", rank=self.rank,
                                      peer=first, op=fp.op, seq=fp.seq)

    def close(self) -> None:
        """Say goodbye to every peer and close the sockets. Safe to call twice."""
        polite = self._lock.acquire(timeout=1.0)  # never interleave with a message in flight
        try:
            if polite:
                for peer, sock in self._socks.items():
                    if peer not in self._unusable:
                        send_goodbye(sock)
            self._close_sockets()
        finally:
            if polite:
                self._lock.release()

    def _sender(self) -> SendWorker:
        if self._worker is None:
            self._worker = SendWorker(self._pump_send, lambda op: self._socks[op.peer], _heads)
        return self._worker

    def _close_sockets(self) -> None:
        if self._worker is not None:
            self._worker.close()
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()

