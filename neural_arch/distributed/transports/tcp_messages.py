"""The messages of one tcp transport call: a send's or a receive's progress through its
stream (header, then payload), and the checks on a caller's buffer."""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Tuple

import numpy as np

from .base import HEADER_SIZE, Fingerprint, Message

# a receive of ``send_recv_chained``: buffer, peer, fingerprint, follow-up (or None)
ChainedRecv = Tuple[np.ndarray, int, Fingerprint, Optional[Callable[[], Sequence[Message]]]]


class Send:
    """Header and payload still to go (``views``) of a message to ``peer``."""

    __slots__ = ("peer", "views", "total", "fp")

    def __init__(self, peer: int, header: bytes, payload: memoryview,
                 fp: Optional[Fingerprint] = None) -> None:
        self.peer, self.total, self.fp = peer, len(header) + payload.nbytes, fp
        self.views = [memoryview(header), payload] if payload.nbytes else [memoryview(header)]


class Recv:
    """A message from ``peer`` landing in ``payload``, its header first; ``then``: the
    follow-up of a chained receive."""

    __slots__ = ("peer", "header", "header_got", "payload", "got", "started", "fp", "then")

    def __init__(self, peer: int, payload: memoryview, fp: Optional[Fingerprint] = None,
                 then: Optional[Callable[[], Sequence[Message]]] = None) -> None:
        self.peer, self.payload, self.fp, self.then = peer, payload, fp, then
        self.header, self.header_got, self.got, self.started = bytearray(HEADER_SIZE), 0, 0, False

    @property
    def done(self) -> bool:
        return self.started and self.got == self.payload.nbytes


def byte_view(buf: np.ndarray, writable: bool, what: str) -> memoryview:
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} buffer must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous:
        raise ValueError(f"{what} buffer must be C-contiguous; got shape {buf.shape} with "
                         f"strides {buf.strides}")
    if writable and not buf.flags.writeable:
        raise ValueError(f"{what} buffer of shape {buf.shape} is read-only")
    return memoryview(buf.reshape(-1).view(np.uint8))


def heads(ops: list) -> list:
    """The first message per peer: a socket carries one message after another."""
    seen: set[int] = set()
    heads = []
    for op in ops:
        if op.peer not in seen:
            seen.add(op.peer)
            heads.append(op)
    return heads
