"""TCP transport: a full mesh of authenticated sockets, one per pair of ranks.

Setup (``tcp_mesh``): every rank publishes its listening address in the store, dials every
lower rank and accepts every higher one; each connection starts with the mutual handshake.

Data: sockets are non-blocking and one poll loop drives every send and receive of a call, so
``sendrecv`` is full duplex and a ring of any size never deadlocks. Payloads move with
``sendmsg``/``recv_into`` straight from and into the arrays (no copies in Python). While it
waits, the loop also watches the other peers' sockets, so the death of any rank surfaces within
a poll interval, naming that rank. ``close`` sends a goodbye header first: a rank that finished
is told apart from one that crashed.
"""
from __future__ import annotations

import select
import socket
import threading
import time
from typing import Optional

import numpy as np

from ..health import heartbeat
from ..errors import CollectiveMismatchError, CollectiveTimeoutError, PeerFailureError
from .base import (HEADER_SIZE, Fingerprint, Transport, check_header, check_job, pack_header,
                   unpack_header)
from .tcp_mesh import build_mesh

_GOODBYE = pack_header(Fingerprint("__goodbye__", 0, "", 0, 0xFFFFFFFF), 0)
_POLL_SLICE_S = 0.1  # how soon a wait notices a failure the heartbeat declared
_IN, _OUT = select.POLLIN | select.POLLPRI, select.POLLOUT


class _Send:
    __slots__ = ("peer", "views", "total", "fp")

    def __init__(self, peer: int, header: bytes, payload: memoryview,
                 fp: Optional[Fingerprint] = None) -> None:
        self.peer, self.total, self.fp = peer, len(header) + payload.nbytes, fp
        self.views = [memoryview(header), payload] if payload.nbytes else [memoryview(header)]


class _Recv:
    __slots__ = ("peer", "header", "header_got", "payload", "got", "started", "fp")

    def __init__(self, peer: int, payload: memoryview, fp: Optional[Fingerprint] = None) -> None:
        self.peer, self.payload, self.fp = peer, payload, fp
        self.header, self.header_got, self.got, self.started = bytearray(HEADER_SIZE), 0, 0, False

    @property
    def done(self) -> bool:
        return self.started and self.got == self.payload.nbytes


def _byte_view(buf: np.ndarray, writable: bool, what: str) -> memoryview:
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} buffer must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{what} buffer must be C-contiguous; got shape {buf.shape} with "
                         f"strides {buf.strides}")
    if writable and not buf.flags.writeable:
        raise ValueError(f"{what} buffer of shape {buf.shape} is read-only")
    return memoryview(buf.reshape(-1).view(np.uint8))


def create(rank: int, world_size: int, store, timeout: float, secret: Optional[bytes] = None,
           host: Optional[str] = None, prefix: str = "tcp") -> "TcpTransport":
    return TcpTransport(rank, world_size, store, timeout, secret=secret, host=host, prefix=prefix)


class TcpTransport(Transport):
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

    # ---- data path ---------------------------------------------------------------------------
    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        payload = _byte_view(buf, False, "send")
        self._check_peer(dst, fp)
        self._run([_Send(dst, pack_header(fp, payload.nbytes), payload)], [], fp)

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        payload = _byte_view(buf, True, "recv")
        self._check_peer(src, fp)
        self._run([], [_Recv(src, payload)], fp)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        out, into = _byte_view(sendbuf, False, "send"), _byte_view(recvbuf, True, "recv")
        self._check_peer(dst, fp)
        self._check_peer(src, fp)
        self._run([_Send(dst, pack_header(fp, out.nbytes), out)], [_Recv(src, into)], fp)

    def send_recv_many(self, sends, recvs) -> None:
        """A batch in one poll loop (``_run``): every socket moves as soon as it can."""
        out, into = [], []
        for buf, dst, fp in sends:
            payload = _byte_view(buf, False, "send")
            self._check_peer(dst, fp)
            out.append(_Send(dst, pack_header(fp, payload.nbytes), payload, fp))
        for buf, src, fp in recvs:
            payload = _byte_view(buf, True, "recv")
            self._check_peer(src, fp)
            into.append(_Recv(src, payload, fp))
        if out or into:
            self._run(out, into, (out or into)[0].fp)

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
            try:
                while True:
                    # one stream per peer: only the first pending message to (from) a peer moves
                    moved = any([self._pump_send(s, s.fp or fp) for s in _heads(sends)] +
                                [self._pump_recv(r, r.fp or fp) for r in _heads(recvs)])
                    sends = [s for s in sends if s.views]
                    recvs = [r for r in recvs if not r.done]
                    if not sends and not recvs:
                        return
                    if not moved:
                        self._wait(_heads(sends), _heads(recvs), known_alive, deadline, fp)
            except BaseException as e:
                for op in sends + recvs:  # a half-moved message leaves the stream unusable
                    self._unusable.setdefault(op.peer, f"{type(e).__name__} in {fp.describe()}")
                raise

    def _wait(self, sends, recvs, known_alive: set[int], deadline: float,
              fp: Fingerprint) -> None:
        """Sleep until a pending socket is ready; meanwhile watch every other peer for death."""
        heartbeat.check(self.rank, fp.op, fp.seq)
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise self._timeout_error(sends, recvs, fp)
        masks: dict[int, int] = {}
        for op, mask in [(s, _OUT) for s in sends] + [(r, _IN) for r in recvs]:
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
        for fd, _ in poller.poll(max(1, int(min(remaining, _POLL_SLICE_S) * 1000))):
            peer = by_fd[fd]
            if peer in watched and self._bystander_settled(peer, fp):
                known_alive.add(peer)

    def _bystander_settled(self, peer: int, fp: Fingerprint) -> bool:
        """A peer we are not talking to became readable: raise if it died; True once we know
        it is alive (data queued for a later call) or gone politely (goodbye consumed)."""
        sock = self._socks[peer]
        try:
            head = sock.recv(HEADER_SIZE, socket.MSG_PEEK)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            raise self._lost(peer, fp, f"its connection failed ({e})") from None
        if head == b"":
            raise self._lost(peer, fp, "it closed its connection without saying goodbye "
                                       "(process died?)")
        if head == _GOODBYE:
            sock.recv(HEADER_SIZE)
            self._unusable[peer] = "the peer closed its transport (it left the job)"
        return True

    def _pump_send(self, op: _Send, fp: Fingerprint) -> bool:
        if not op.views:
            return False
        try:
            sent = self._socks[op.peer].sendmsg(op.views)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            raise self._lost(op.peer, fp, f"sending failed ({e})") from None
        while sent:
            if sent >= op.views[0].nbytes:
                sent -= op.views.pop(0).nbytes
            else:
                op.views[0], sent = op.views[0][sent:], 0
        return True

    def _pump_recv(self, op: _Recv, fp: Fingerprint) -> bool:
        sock, moved = self._socks[op.peer], False
        while not op.done:
            into = (memoryview(op.header)[op.header_got:] if not op.started
                    else op.payload[op.got:])
            try:
                n = sock.recv_into(into)
            except (BlockingIOError, InterruptedError):
                return moved
            except OSError as e:
                raise self._lost(op.peer, fp, f"receiving failed ({e})") from None
            if n == 0:
                raise self._lost(op.peer, fp, "it closed the connection "
                                 f"({'mid-message' if op.header_got else 'before sending'})")
            moved = True
            if op.started:
                op.got += n
                continue
            op.header_got += n
            if op.header_got == HEADER_SIZE:
                self._check_incoming(op, fp)
        return moved

    def _check_incoming(self, op: _Recv, fp: Fingerprint) -> None:
        if bytes(op.header) == _GOODBYE:
            # A peer that leaves mid-collective usually left because another rank failed: name
            # that rank when the heartbeat knows it or its connection is already dead, rather
            # than the messenger.
            heartbeat.check(self.rank, fp.op, fp.seq)
            for other in self._socks:
                if other != op.peer and other not in self._unusable:
                    self._bystander_settled(other, fp)  # raises when ``other`` died
            raise self._lost(op.peer, fp, "it closed its transport (it left the job)")
        try:
            got, nbytes = unpack_header(op.header)
        except ValueError as e:
            raise CollectiveMismatchError(f"peer rank {op.peer} sent a malformed header ({e}) "
                                          f"while we expected {fp.describe()}", rank=self.rank,
                                          peer=op.peer, op=fp.op, seq=fp.seq) from None
        check_header(fp, got, nbytes, op.payload.nbytes, rank=self.rank, peer=op.peer)
        op.started = True

    def _lost(self, peer: int, fp: Fingerprint, why: str) -> PeerFailureError:
        self._unusable[peer] = f"lost during {fp.describe()}: {why}"
        return PeerFailureError(f"lost peer rank {peer} during {fp.describe()}: {why}",
                                rank=self.rank, peer=peer, op=fp.op, seq=fp.seq)

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
                        _send_goodbye(sock)
            self._close_sockets()
        finally:
            if polite:
                self._lock.release()

    def _close_sockets(self) -> None:
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()


def _heads(ops: list) -> list:
    """The first message per peer: a socket carries one message after another."""
    seen: set[int] = set()
    heads = []
    for op in ops:
        if op.peer not in seen:
            seen.add(op.peer)
            heads.append(op)
    return heads


def _send_goodbye(sock: socket.socket) -> None:
    try:
        sock.setblocking(True)
        sock.settimeout(0.5)
        sock.sendall(_GOODBYE)
    except OSError:
        pass
