"""The interface every transport implements, and the fingerprint each message carries.

A transport moves bytes of contiguous NumPy arrays between ranks; collective algorithms are
written once against it. Every payload is preceded by a fixed-size header holding the
fingerprint of the collective that sent it (operation, group, sequence number, dtype, element
count of the whole collective) and the payload length. The receiver compares it with the
fingerprint it expects, so ranks that call mismatched collectives fail with an error naming both
sides instead of hanging or reading wrong data.

A rooted collective names its root (a group rank) at the end of its operation name
(``broadcast:2``, ``reduce:sum:0``): ``split_root`` reads it back, and ``check_roots`` is the
error every transport raises when ranks passed different roots.
"""
from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from typing import Any, Callable, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from ..errors import CollectiveMismatchError

_MAGIC = b"NFv1"
# magic, op name (24 bytes, NUL padded), group id; then seq, dtype str (8 bytes), count,
# payload bytes
_BEFORE_SEQ = "<4s24sI"
_HEADER = struct.Struct(_BEFORE_SEQ + "Q8sQQ")
HEADER_SIZE = _HEADER.size
SEQ_OFFSET = struct.calcsize(_BEFORE_SEQ)  # where a header's seq lies (8 bytes, little-endian)


class Fingerprint(NamedTuple):
    """What a message belongs to; equal on every rank taking part in the same collective."""

    op: str
    seq: int
    dtype: str
    count: int
    group: int = 0

    def describe(self) -> str:
        return f"{self.op} #{self.seq} (group {self.group}, {self.count} x {self.dtype})"


def pack_header(fp: Fingerprint, nbytes: int) -> bytes:
    return _HEADER.pack(_MAGIC, fp.op.encode()[:24], fp.group, fp.seq, fp.dtype.encode()[:8],
                        fp.count, nbytes)


def unpack_header(raw: bytes | memoryview) -> tuple[Fingerprint, int]:
    """Decode a header; raises ValueError on anything that is not one of ours."""
    if len(raw) != HEADER_SIZE:
        raise ValueError(f"header must be {HEADER_SIZE} bytes, got {len(raw)}")
    magic, op, group, seq, dtype, count, nbytes = _HEADER.unpack(raw)
    if magic != _MAGIC:
        raise ValueError(f"bad magic {magic!r} in message header")
    fp = Fingerprint(op.rstrip(b"\0").decode(errors="replace"), seq,
                     dtype.rstrip(b"\0").decode(errors="replace"), count, group)
    return fp, nbytes


def check_header(expected: Fingerprint, got: Fingerprint, nbytes: int, expected_nbytes: int,
                 *, rank: int, peer: int) -> None:
    """Raise CollectiveMismatchError naming both sides when a message is not what we wait for."""
    if got != expected:
        raise CollectiveMismatchError(
            f"expected {expected.describe()} but peer rank {peer} sent {got.describe()}: "
            "ranks called different collectives",
            rank=rank, peer=peer, op=expected.op, seq=expected.seq)
    if nbytes != expected_nbytes:
        raise CollectiveMismatchError(
            f"expected a {expected_nbytes}-byte payload for {expected.describe()} but peer rank "
            f"{peer} sent {nbytes} bytes", rank=rank, peer=peer, op=expected.op, seq=expected.seq)


def split_root(op: str) -> tuple[str, Optional[int]]:
    """(operation name without its root, the root) of a rooted collective's operation name;
    (``op``, None) for any other."""
    name, _, tail = op.rpartition(":")
    return (name, int(tail)) if name and tail.isdigit() else (op, None)


def who_chose(values: Sequence[Any], phrase: str, ranks: Optional[Sequence[int]] = None) -> str:
    """``'ranks 0, 2 passed root 0; rank 1 passed root 1'``: each distinct value (in the order
    ranks first chose it) with the ranks that chose it (``values[i]`` is rank ``ranks[i]``'s,
    by default rank ``i``'s); ``phrase`` formats the value."""
    chose: dict = {}
    for i, value in enumerate(values):
        chose.setdefault(value, []).append(i if ranks is None else ranks[i])
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))} "
                     f"{phrase.format(value)}" for value, rs in chose.items())


def check_roots(roots: Sequence[int], fp: Fingerprint, t: "Transport") -> None:
    """CollectiveMismatchError naming every rank's root unless ``roots`` (one per rank of
    ``t``, in rank order) are all the same. Ranks and roots are named as job-wide ranks, as
    the caller passed them."""
    if any(root != roots[0] for root in roots):
        name = split_root(fp.op)[0]
        ranks = [t.global_rank(r) for r in range(len(roots))]
        who = who_chose([ranks[root] for root in roots], "passed root {}", ranks)
        raise CollectiveMismatchError(
            f"ranks passed different roots to {name} #{fp.seq} (group {fp.group}, {fp.count} x "
            f"{fp.dtype}): {who}; every rank must pass the same root",
            rank=t.global_rank(t.rank), op=fp.op, seq=fp.seq)


# A two-rank rooted collective of at most this many bytes goes in one exchange with its root
# check (``swap_with_root``): at 4 B, 4 KiB and 16 KiB the other rank's unneeded payload cost
# less than the round trip saved on the mpi and tcp transports (broadcast measured,
# ``benchmarks/RESULTS.md``), though at 16 KiB the gain had shrunk on mpi (60-64 us to 52).
PAIR_ROOTED_MAX_BYTES = 16 << 10
_CLAIM = 8  # the root a rank passed, as one int64 in front of the payload


def swap_with_root(t: "Transport", root: int, fp: Fingerprint, payload: Optional[np.ndarray],
                   nbytes: int) -> np.ndarray:
    """Two ranks: send the root this rank passed followed by ``payload``'s ``nbytes`` bytes
    (zeros when None), receive the peer's, and return the peer's payload (uint8) once both
    passed the same root; otherwise raise the same ``CollectiveMismatchError`` on both,
    naming both roots (``check_roots``).

    The portable rooted collectives first agree on the root (``algorithms.agreement``: an
    exchange of roots) and then move the data: two round trips. At two ranks the root claim
    rides in front of the data instead, the rank with nothing to send sending zeros of the
    same size so that both messages match; since each rank received the one message it
    expected, a mismatch leaves nothing in flight and the group usable. The exchange is
    labelled with the fingerprint without its root, as the agreement's is, so a peer in
    another call altogether is still named by the transport's header check. With ``nbytes``
    0 it is the agreement alone."""
    if not 0 <= root < 2:
        raise ValueError(f"root rank {root} is out of range for world size 2")
    rank = t.rank
    name, named = split_root(fp.op)
    out = np.zeros(_CLAIM + nbytes, np.uint8) if payload is None else \
        np.empty(_CLAIM + nbytes, np.uint8)
    out[:_CLAIM].view(np.int64)[0] = root
    if payload is not None:
        out[_CLAIM:] = payload.view(np.uint8)
    got = np.empty_like(out)
    t.sendrecv(out, 1 - rank, got, 1 - rank, fp if named is None else fp._replace(op=name))
    theirs = int(got[:_CLAIM].view(np.int64)[0])
    check_roots([root, theirs] if rank == 0 else [theirs, root], fp, t)
    return got[_CLAIM:]


def pair_broadcast(t: "Transport", buf: np.ndarray, root: int, fp: Fingerprint) -> bool:
    """Broadcast ``buf`` (1-D, contiguous; writable on the rank that is not the root) between
    two ranks in one exchange with the root check (``swap_with_root``: the root sends its
    data, the other rank zeros), and return True; False (nothing sent) at another world size
    or above ``PAIR_ROOTED_MAX_BYTES``."""
    if t.world_size != 2 or buf.nbytes > PAIR_ROOTED_MAX_BYTES:
        return False
    data = buf.view(np.uint8)
    got = swap_with_root(t, root, fp, data if t.rank == root else None, data.nbytes)
    if t.rank != root:
        data[:] = got
    return True


def check_job(rank, world_size, timeout) -> None:
    """ValueError unless ``rank`` of ``world_size`` ranks and ``timeout`` seconds make sense."""
    if not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size must be a positive int, got {world_size!r}")
    if not isinstance(rank, int) or not 0 <= rank < world_size:
        raise ValueError(f"rank {rank!r} is outside [0, {world_size})")
    if not timeout > 0:
        raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")


# one message of a batch (``Transport.send_recv_many``): buffer, peer rank, fingerprint
Message = Tuple[np.ndarray, int, Fingerprint]


class Transport(ABC):
    """Point-to-point byte movement between the ranks of one job.

    Buffers are 1-D C-contiguous NumPy arrays (views are fine); ``recv`` fills its buffer in
    place. Calls block until done, or raise a ``DistributedError`` subclass naming the peer:
    ``PeerFailureError`` when the peer died, ``CollectiveTimeoutError`` past ``timeout``,
    ``CollectiveMismatchError`` when the header's fingerprint differs from ``fp``.
    """

    name: str = "base"

    def __init__(self, rank: int, world_size: int, timeout: float) -> None:
        self.rank = rank
        self.world_size = world_size
        self.timeout = timeout

    @abstractmethod
    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        """Send the bytes of ``buf`` to rank ``dst``."""

    @abstractmethod
    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        """Receive exactly ``buf.nbytes`` bytes from rank ``src`` into ``buf``."""

    @abstractmethod
    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        """Send to ``dst`` and receive from ``src`` at the same time (never deadlocks a ring)."""

    def send_recv_many(self, sends: Sequence[Message], recvs: Sequence[Message]) -> None:
        """Move every message of a batch: each is ``(buf, peer, fp)``, sends read from ``buf``,
        receives fill it. Messages to (from) one peer go in list order; messages to different
        peers, and sends beside receives, should progress together, so that two ranks that
        send each other more than the transport buffers (MPI's rendezvous, a full ring) do not
        wait on each other for ever.

        This default runs the sends, then the receives, one after another: right only where a
        send completes before its receiver arrives. The shipped CPU transports override it
        with one loop that progresses every message of the batch.
        """
        for buf, peer, fp in sends:
            self.send(buf, peer, fp)
        for buf, peer, fp in recvs:
            self.recv(buf, peer, fp)

    @abstractmethod
    def close(self) -> None:
        """Release sockets, segments and threads. Safe to call twice."""

    def global_rank(self, rank: int) -> int:
        """The job-wide rank of this transport's ``rank`` (a subgroup's transport translates)."""
        return rank

    def native_collectives(self):
        """The transport's own collectives, or None. The object has ``all_reduce(buf, op, fp)``
        (AVERAGE included), ``broadcast(buf, root, fp)``, ``all_gather(sendbuf, recvbuf, fp)``,
        ``reduce_scatter(sendbuf, recvbuf, op, fp)`` and ``barrier(fp)`` on 1-D contiguous
        buffers, a ``name`` (the algorithm name callers see) and ``preferred``: whether
        ``algorithms.select`` should choose them over the portable algorithms by default."""
        return None

    def ring_all_reduce(self, buf: np.ndarray, op, fp: Fingerprint, mean: int = 0) -> bool:
        """Run the ring all-reduce (``algorithms.ring``) on ``buf`` in a form of this
        transport's own, with the ring's bits, and return True; False (the default): the ring
        runs its portable steps."""
        return False

    def exchange_reduce(self, buf: np.ndarray, peer: int, fp: Fingerprint,
                        combine: Callable[..., Any], theirs_first: bool) -> bool:
        """One round of recursive doubling (``algorithms.recursive_doubling``) in a form of this
        transport's own: swap ``buf`` with ``peer``'s vector of the same size and fold it into
        ``buf`` with ``combine``, the peer's operand first when ``theirs_first``, and return
        True; False (the default): the round runs as a ``sendrecv`` and a combine."""
        return False

    def exchange_reduce_plan(self, peer: int, dtype: np.dtype, count: int,
                             combine: Callable[..., Any], theirs_first: bool, mean: int = 0
                             ) -> Optional[Callable[[np.ndarray, Fingerprint], None]]:
        """``run(buf, fp)``: ``exchange_reduce`` of every buffer of ``count`` elements of
        ``dtype`` with ``peer``, then divided by ``mean`` unless 0, what its calls share taken
        once (a plan of ``algorithms.recursive_doubling``); None (the default) where this
        transport has no such form of its own."""
        return None

    def check_peer_rank(self, peer, fp: Fingerprint) -> None:
        """ValueError unless ``peer`` is another rank of this job."""
        if not isinstance(peer, (int, np.integer)) or not 0 <= peer < self.world_size:
            raise ValueError(f"peer rank {peer!r} is outside [0, {self.world_size}) for "
                             f"{fp.describe()}")
        if peer == self.rank:
            raise ValueError(f"rank {self.rank} cannot send to or receive from itself "
                             f"({fp.describe()})")
