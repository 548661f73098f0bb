"""Point-to-point messages of the shared-memory transport, through one ring per ordered pair.

Each ordered pair (src -> dst) has a ring of slots with two counters in the segment
(``layout``): chunks written (by src) and chunks read (by dst). A message is its header (checked
by the receiver) in the first slot's header area, and its bytes cut into slot-sized chunks. A
writer copies its data, then stores the counter; a reader loads the counter, then the data
(``transport`` says why that ordering suffices on x86-64).

``RingMessages`` is the part of ``ShmTransport`` that moves messages; the transport holds the
segment, its layout and the peers' liveness.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ...errors import CollectiveMismatchError, DistributedError
from ..base import HEADER_SIZE, Fingerprint, check_header, pack_header, unpack_header
from .collectives import checked_vector
from .waiting import MIN_SPIN_POLLS, SPIN_POLLS, Backoff


def _byte_view(buf: Any, what: str, writable: bool = False) -> np.ndarray:
    return checked_vector(buf, what, writable).view(np.uint8)


class RingMessages:
    """send, recv, sendrecv and send_recv_many of ``ShmTransport`` (which this is mixed into:
    it provides ``layout``, ``ctrl``, ``shared``, ``_mm``, ``watch``, ``_sent``/``_received``
    and ``closed``)."""

    def _check_peer(self, peer: int, what: str) -> None:
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.world_size:
            raise ValueError(f"{what}: peer rank {peer!r} is outside 0..{self.world_size - 1}")
        if peer == self.rank:
            raise ValueError(f"{what}: rank {self.rank} cannot exchange messages with itself")

    def _try_push(self, dst: int, data: np.ndarray, chunk: int, header: bytes) -> bool:
        """Write chunk number ``chunk`` of a message to ``dst`` if a slot is free."""
        layout, ctrl = self.layout, self.ctrl
        count = self._sent[dst]
        if count - ctrl[layout.read_word(self.rank, dst)] >= layout.slots:
            return False
        slot = count % layout.slots
        if chunk == 0:
            start = layout.slot_header(self.rank, dst, slot)
            self._mm[start:start + HEADER_SIZE] = header
        lo = chunk * layout.slot_bytes
        hi = min(lo + layout.slot_bytes, data.size)
        if hi > lo:
            start = layout.slot_data(self.rank, dst, slot)
            np.copyto(self.shared[start:start + hi - lo], data[lo:hi])
        self._sent[dst] = count + 1
        ctrl[layout.written_word(self.rank, dst)] = count + 1
        return True

    def _try_pull(self, src: int, out: np.ndarray, chunk: int, fp: Fingerprint) -> bool:
        """Read chunk number ``chunk`` of a message from ``src`` if it has arrived."""
        layout, ctrl = self.layout, self.ctrl
        count = self._received[src]
        if ctrl[layout.written_word(src, self.rank)] <= count:
            return False
        slot = count % layout.slots
        if chunk == 0:
            start = layout.slot_header(src, self.rank, slot)
            got, nbytes = unpack_header(self._mm[start:start + HEADER_SIZE])
            check_header(fp, got, nbytes, out.size, rank=self.rank, peer=src)
        lo = chunk * layout.slot_bytes
        hi = min(lo + layout.slot_bytes, out.size)
        if hi > lo:
            start = layout.slot_data(src, self.rank, slot)
            np.copyto(out[lo:hi], self.shared[start:start + hi - lo])
        self._received[src] = count + 1
        ctrl[layout.read_word(src, self.rank)] = count + 1
        return True

    def _transfer(self, out_msg, in_msg, fp: Fingerprint, what: str) -> None:
        """Move one outgoing and/or one incoming message, whichever can progress, until done."""
        if self.closed:
            raise DistributedError("the shared-memory transport is closed", rank=self.rank,
                                   op=fp.op, seq=fp.seq)
        chunk_bytes = self.layout.slot_bytes
        sent = received = 0
        n_send = n_recv = 0
        peers = []
        if out_msg is not None:
            data, dst = out_msg
            n_send = max(1, -(-data.size // chunk_bytes))
            header = pack_header(fp, data.size)
            peers.append(dst)
        if in_msg is not None:
            out, src = in_msg
            n_recv = max(1, -(-out.size // chunk_bytes))
            peers.append(src)
        watch = self.watch
        # A message that needs no waiting looks too (at most every ~100 ms): a subgroup's
        # collectives may run on for ever on quick messages while a rank outside it is dead.
        watch.look(peers, fp.op, fp.seq)
        idle, backoff = 0, None
        while sent < n_send or received < n_recv:
            moved = False
            if sent < n_send and self._try_push(dst, data, sent, header):
                sent += 1
                moved = True
            if received < n_recv and self._try_pull(src, out, received, fp):
                received += 1
                moved = True
            if moved:
                if backoff is None and idle and watch.spin_polls < SPIN_POLLS:
                    watch.spin_polls *= 2  # polling sufficed: the peer is running
                idle, backoff = 0, None
                continue
            idle += 1
            # one poll of both rings costs about as much as ten polls of a counter
            if idle * 10 < watch.spin_polls:
                continue
            if backoff is None:
                watch.spin_polls = max(MIN_SPIN_POLLS, watch.spin_polls // 2)
                backoff = Backoff(self.watch, self.timeout, fp.op, fp.seq, what)
            pending = ([dst] if sent < n_send else []) + ([src] if received < n_recv else [])
            backoff.pause(pending)

    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        self._check_peer(dst, "send")
        data = _byte_view(buf, "send")
        self._transfer((data, dst), None, fp, f"a free slot in the ring to rank {dst}")

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        self._check_peer(src, "recv")
        out = _byte_view(buf, "recv", writable=True)
        self._transfer(None, (out, src), fp, f"a message from rank {src}")

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        data = _byte_view(sendbuf, "sendrecv")
        out = _byte_view(recvbuf, "sendrecv", writable=True)
        if dst == self.rank and src == self.rank:
            if data.size != out.size:
                raise CollectiveMismatchError(
                    f"sendrecv to itself with {data.size} bytes sent but {out.size} expected",
                    rank=self.rank, peer=self.rank, op=fp.op, seq=fp.seq)
            np.copyto(out, data)
            return
        self._check_peer(dst, "sendrecv")
        self._check_peer(src, "sendrecv")
        self._transfer((data, dst), (out, src), fp,
                       f"the ring exchange (to rank {dst}, from rank {src})")

    def send_recv_many(self, sends, recvs) -> None:
        """A batch of messages in one polling loop: every peer's ring moves as soon as it can,
        so two ranks sending each other more than a ring holds both make progress. Messages to
        (from) one peer keep their order: that ring carries them one after another."""
        if self.closed:
            raise DistributedError("the shared-memory transport is closed", rank=self.rank)
        chunk_bytes = self.layout.slot_bytes
        # per peer: the messages still to move, each [bytes, fp, header, chunks, chunks moved]
        out_q: dict = {}
        in_q: dict = {}
        for queues, msgs, what in ((out_q, sends, "send"), (in_q, recvs, "recv")):
            for buf, peer, fp in msgs:
                self._check_peer(peer, what)
                data = _byte_view(buf, what, writable=what == "recv")
                header = pack_header(fp, data.size) if what == "send" else None
                chunks = max(1, -(-data.size // chunk_bytes))
                queues.setdefault(int(peer), []).append([data, fp, header, chunks, 0])
        if not out_q and not in_q:
            return
        first = (sends or recvs)[0][2]
        watch = self.watch
        watch.look(sorted(set(out_q) | set(in_q)), first.op, first.seq)
        backoff = None
        while out_q or in_q:
            moved = False
            for dst in list(out_q):
                msg = out_q[dst][0]
                while msg[4] < msg[3] and self._try_push(dst, msg[0], msg[4], msg[2]):
                    msg[4] += 1
                    moved = True
                if msg[4] == msg[3]:
                    out_q[dst].pop(0)
                    if not out_q[dst]:
                        del out_q[dst]
            for src in list(in_q):
                msg = in_q[src][0]
                while msg[4] < msg[3] and self._try_pull(src, msg[0], msg[4], msg[1]):
                    msg[4] += 1
                    moved = True
                if msg[4] == msg[3]:
                    in_q[src].pop(0)
                    if not in_q[src]:
                        del in_q[src]
            if moved:
                backoff = None
                continue
            pending = sorted(set(out_q) | set(in_q))
            if backoff is None:
                fp = (out_q[pending[0]] if pending[0] in out_q else in_q[pending[0]])[0][1]
                backoff = Backoff(self.watch, self.timeout, fp.op, fp.seq,
                                  f"a batch of messages (to ranks {sorted(out_q)}, from ranks "
                                  f"{sorted(in_q)})")
            backoff.pause(pending)

