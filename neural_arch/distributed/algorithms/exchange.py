"""Point-to-point building blocks shared by the collective algorithms.

Zero-length pieces are never put on the wire: both sides compute the same piece sizes, so a
side with nothing to send (or receive) simply skips that half of the exchange, and transports
never see empty payloads.
"""
from __future__ import annotations

from typing import Iterator

import numpy as np

from ..transports.base import Fingerprint, Message, Transport

# Largest piece of one message; large collectives are cut into pieces of this size so that a
# peer can start forwarding or reducing the first piece while later ones are still in flight.
SEGMENT_BYTES = 1 << 20


def segment_elems(itemsize: int) -> int:
    return max(1, SEGMENT_BYTES // itemsize)


def exchange(t: Transport, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
             fp: Fingerprint) -> None:
    """Send ``sendbuf`` to ``dst`` while receiving ``recvbuf`` from ``src``, piece by piece."""
    seg = segment_elems(max(sendbuf.itemsize, recvbuf.itemsize))
    for out_part, in_part in segment_pairs(sendbuf.size, recvbuf.size, seg):
        out, into = sendbuf[out_part], recvbuf[in_part]
        if out.size and into.size:
            t.sendrecv(out, dst, into, src, fp)
        elif out.size:
            t.send(out, dst, fp)
        else:
            t.recv(into, src, fp)


def send(t: Transport, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
    seg = segment_elems(buf.itemsize)
    for lo in range(0, buf.size, seg):
        t.send(buf[lo:lo + seg], dst, fp)


def recv(t: Transport, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
    seg = segment_elems(buf.itemsize)
    for lo in range(0, buf.size, seg):
        t.recv(buf[lo:lo + seg], src, fp)


def batch(t: Transport, sends: list[Message], recvs: list[Message]) -> None:
    """Every message of ``sends`` and ``recvs`` at once (``Transport.send_recv_many``), each cut
    into the pieces ``send`` and ``recv`` use, so a batched message matches a plain one."""
    def pieces(msgs: list[Message]) -> list[Message]:
        out = []
        for buf, peer, fp in msgs:
            seg = segment_elems(buf.itemsize)
            out += [(buf[lo:lo + seg], peer, fp) for lo in range(0, buf.size, seg)]
        return out
    t.send_recv_many(pieces(sends), pieces(recvs))


def chunk_bounds(count: int, parts: int) -> list[tuple[int, int]]:
    """Split ``count`` elements into ``parts`` near-equal [start, stop) ranges (larger first)."""
    base, extra = divmod(count, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def segment_pairs(send_len: int, recv_len: int, seg: int) -> Iterator[tuple[slice, slice]]:
    """Matching slices of a send range and a receive range cut into ``seg``-element pieces.

    Piece ``i`` of a range is the same on the rank sending it and the rank receiving it, so the
    two sides agree on every message size even when the ranges differ in length.
    """
    pieces = max(-(-send_len // seg), -(-recv_len // seg))
    for i in range(pieces):
        lo = i * seg
        yield (slice(min(lo, send_len), min(lo + seg, send_len)),
               slice(min(lo, recv_len), min(lo + seg, recv_len)))
