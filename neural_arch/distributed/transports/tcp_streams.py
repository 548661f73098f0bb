"""The tcp transport's streams, one socket per peer: what moves one message's bytes through its
socket (``_pump_send``, ``_pump_recv``), checks the header that starts it, and tells a peer that
died from one that left politely, with its goodbye header (``_bystander_settled``).

``PeerStreams`` holds these steps of ``TcpTransport`` (``tcp``), each on one socket; the
transport's poll loop decides which socket moves when. A message that fails halfway leaves its
stream unusable (``_lost`` records why, and the error names the peer).
"""
from __future__ import annotations

import socket

from ..health import heartbeat
from ..errors import CollectiveMismatchError, PeerFailureError
from .base import HEADER_SIZE, Fingerprint, check_header, pack_header, unpack_header
from .tcp_messages import Recv, Send

# The header a transport sends each peer as it closes: a peer that finished is told apart
# from one that crashed.
GOODBYE = pack_header(Fingerprint("__goodbye__", 0, "", 0, 0xFFFFFFFF), 0)


class PeerStreams:
    """The per-socket steps of ``TcpTransport``: it provides ``rank``, the connected sockets
    ``_socks`` (peer -> socket) and ``_unusable`` (peer -> why its stream cannot be used)."""

    rank: int
    _socks: dict[int, socket.socket]
    _unusable: dict[int, str]

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
        if head == GOODBYE:
            sock.recv(HEADER_SIZE)
            self._unusable[peer] = "the peer closed its transport (it left the job)"
        return True

    def _pump_send(self, op: Send) -> bool:
        if not op.views:
            return False
        try:
            sent = self._socks[op.peer].sendmsg(op.views)
        except (BlockingIOError, InterruptedError):
            return False
        except OSError as e:
            raise self._lost(op.peer, op.fp, f"sending failed ({e})") from None
        while sent:
            if sent >= op.views[0].nbytes:
                sent -= op.views.pop(0).nbytes
            else:
                op.views[0], sent = op.views[0][sent:], 0
        return True

    def _pump_recv(self, op: Recv, fp: Fingerprint) -> bool:
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

    def _check_incoming(self, op: Recv, fp: Fingerprint) -> None:
        if bytes(op.header) == GOODBYE:
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


def send_goodbye(sock: socket.socket) -> None:
    """Send ``GOODBYE`` on ``sock``, waiting half a second at most: a socket that cannot take
    it is broken or its peer is gone, and closing goes on either way."""
    try:
        sock.setblocking(True)
        sock.settimeout(0.5)
        sock.sendall(GOODBYE)
    except OSError:
        pass
