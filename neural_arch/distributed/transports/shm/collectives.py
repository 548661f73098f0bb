"""The shared-memory transport's own collectives: what ``native_collectives()`` returns.

``algorithms.select`` runs these whenever a group is the whole world of an shm transport
(``preferred``). Each call is checked here; a vector of up to ``direct.SMALL_BYTES`` (a
broadcast: ``broadcast_plan_bytes``) runs its plan (``plans``: one per collective, dtype and
shape, prepared once), a larger one the round-based algorithms of ``direct``. This object
holds everything those keep between calls: the workspace views per dtype, the fingerprint
signatures, the header last written to each header area, the plans and the workspace writer.
Its barrier is the transport's ``generation``.
"""
from __future__ import annotations

import zlib
from typing import Any, Optional

import numpy as np

from ...errors import CollectiveMismatchError, DistributedError
from ...reduce_ops import as_reduce_op, check_dtype_for_op
from ..base import HEADER_SIZE, Fingerprint, check_roots, pack_header, split_root, unpack_header
from . import direct, plans, single_copy
from .layout import STORES
from .pair_rounds import PairRounds
from .short_calls import ShortCalls
from .writer import AreaWriter

MAX_SIGNATURES = 4096
# A reduce-scatter of at most this many input bytes runs as the all-reduce of a copy of its
# input (a prepared plan), this rank keeping its part: on a few bytes the plan's one generation
# costs less than the reduce-scatter's rounds through Python (benchmarks/RESULTS.md, "Small
# collectives as one all-reduce").
SUMMED_REDUCE_SCATTER_BYTES = 16 << 10
STREAMING, NOT_STREAMING = 2, 1  # a rank's STORES word (0: not published yet)


def checked_vector(buf: Any, what: str, writable: bool = False) -> np.ndarray:
    """``buf`` if it is a 1-D C-contiguous NumPy array (writable if asked); else the error."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} must be a NumPy array, got {type(buf).__name__}")
    if buf.ndim != 1 or not buf.flags.c_contiguous:
        raise ValueError(f"{what} must be a 1-D C-contiguous array, got shape {buf.shape} "
                         f"with strides {buf.strides}")
    if writable and not buf.flags.writeable:
        raise ValueError(f"{what} must be writable (shape {buf.shape}, dtype {buf.dtype})")
    return buf


class ShmCollectives:
    """All-reduce, broadcast, all-gather, reduce-scatter and barrier of one ``ShmTransport``."""

    name = "shm_direct"  # the algorithm name callers see (and may force)
    preferred = True     # chosen over ring and tree whenever it can run
    # they meet on the segment's control lines, never in the transport's messages, where a
    # forced ring or tree runs (``algorithms._chosen``)
    separate_channel = True

    def __init__(self, transport: Any) -> None:
        self.t, self.layout, self.generation = transport, transport.layout, transport.generation
        self.rank, self.world_size = transport.rank, transport.world_size
        self.writer = AreaWriter()  # large copies into the workspace
        # Published before this rank's pid (``transport``), so every rank reads it once every
        # pid is in (``peer_reads_agreed``).
        transport.ctrl[self.layout.rank_word(self.rank, STORES)] = (
            STREAMING if self.writer.choice == "stream" else NOT_STREAMING)
        self.plans: dict = {}       # the prepared small collectives (see plans)
        # the signature whose header each header area holds (compiled code reads it too)
        self.header_sigs = np.zeros(2, np.int64)
        self.closed = False         # set with the transport's: the workspace is gone
        self.short_calls = ShortCalls(self)  # the public calls' entries (short_calls)
        self.pair_rounds = PairRounds(self)  # the two-rank rounds compiled (pair_rounds)
        self.broadcast_plan_bytes = 0  # the largest broadcast a plan takes (``peer_reads_agreed``)
        self.peer_reads_agreed()
        self._views: dict = {}
        self._sigs: dict = {}

    # ----- the collectives -------------------------------------------------------------------
    def all_reduce(self, buf: np.ndarray, op: Any, fp: Fingerprint) -> None:
        """Reduce ``buf`` over all ranks in place; bit-identical results everywhere."""
        try:
            run = self.plans.get(("all_reduce", buf.dtype, buf.size, op))
        except AttributeError:
            run = None  # not an array: checked_vector names it
        if run is not None and buf.ndim == 1:
            flags = buf.flags
            if flags.c_contiguous and flags.writeable:
                run(buf, fp)
                return
        checked_vector(buf, "all_reduce buffer", writable=True)
        given, op = op, as_reduce_op(op)
        check_dtype_for_op(buf.dtype, op)
        if self.world_size == 1:
            return
        if buf.nbytes <= self.small_bytes():
            plans.build(self, ("all_reduce", buf.dtype, buf.size, given))(buf, fp)
        elif self.world_size == 2:
            direct.pair_all_reduce(self, buf, op, fp)
        else:
            direct.large_all_reduce(self, buf, op, fp)

    def broadcast(self, buf: np.ndarray, root: int, fp: Fingerprint) -> None:
        """Copy ``root``'s ``buf`` into every rank's ``buf`` in place."""
        checked_vector(buf, "broadcast buffer", writable=self.rank != root)
        if not isinstance(root, (int, np.integer)) or not 0 <= root < self.world_size:
            raise ValueError(f"broadcast root {root!r} is outside 0..{self.world_size - 1}")
        if self.world_size == 1:
            return
        data = buf.view(np.uint8)
        if data.size > self.broadcast_plan_bytes:
            least = single_copy.BROADCAST_MIN_BYTES.get(self.world_size)
            if least is not None and data.size >= least and self.t.peer_reads.usable:
                single_copy.broadcast(self, data, int(root), fp)
            else:
                direct.broadcast(self, data, int(root), fp)
            return
        if not data.flags.writeable:  # a root's read-only bytes: compiled plans take writable
            data = data.copy()        # arrays only, and a copy of at most a plan's size is cheap
        key = ("broadcast", data.size, int(root))
        (self.plans.get(key) or plans.build(self, key))(data, fp)

    def all_gather(self, sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
        """``recvbuf`` (world_size x len(sendbuf), rank order) receives every rank's ``sendbuf``."""
        try:
            run = self.plans.get(("all_gather", sendbuf.dtype, sendbuf.size))
        except AttributeError:
            run = None  # not an array: checked_vector names it
        if (run is not None and recvbuf.dtype == sendbuf.dtype and sendbuf.ndim == recvbuf.ndim
                == 1 and recvbuf.size == self.world_size * sendbuf.size
                and sendbuf.flags.c_contiguous and recvbuf.flags.c_contiguous
                and recvbuf.flags.writeable):
            run(sendbuf, recvbuf, fp)
            return
        self._check_blocks("all_gather", sendbuf, recvbuf, recvbuf, sendbuf)
        p, n = self.world_size, sendbuf.size
        if p == 1:
            recvbuf[:] = sendbuf
        elif sendbuf.nbytes > self.small_bytes():
            direct.all_gather(self, sendbuf, recvbuf, fp)
        else:
            key = ("all_gather", sendbuf.dtype, n)
            (self.plans.get(key) or plans.build(self, key))(sendbuf, recvbuf, fp)

    def reduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray, op: Any,
                       fp: Fingerprint) -> None:
        """``recvbuf`` (length n) receives chunk ``rank`` of the reduction of ``sendbuf``."""
        self._check_blocks("reduce_scatter", sendbuf, recvbuf, sendbuf, recvbuf)
        op = as_reduce_op(op)
        check_dtype_for_op(sendbuf.dtype, op)
        if self.world_size == 1:
            recvbuf[:] = sendbuf
        elif sendbuf.nbytes <= self.summed_reduce_scatter_bytes():
            whole = sendbuf.copy()
            self.all_reduce(whole, op, fp)
            n = recvbuf.size
            recvbuf[:] = whole[self.rank * n:(self.rank + 1) * n]
        else:
            direct.reduce_scatter(self, sendbuf, recvbuf, op, fp)

    def barrier(self, fp: Fingerprint) -> None:
        """Return once every rank has called ``barrier`` with the same fingerprint."""
        if self.world_size > 1:
            direct.barrier(self, fp)

    def _check_blocks(self, what: str, sendbuf: Any, recvbuf: Any, whole: np.ndarray,
                      block: np.ndarray) -> None:
        """Both buffers 1-D and contiguous, ``recvbuf`` writable, and ``whole`` holding
        world_size blocks of ``block``'s elements and dtype."""
        checked_vector(sendbuf, f"{what} sendbuf")
        checked_vector(recvbuf, f"{what} recvbuf", writable=True)
        p, n = self.world_size, block.size
        if whole.size != p * n or whole.dtype != block.dtype:
            name = "recvbuf" if whole is recvbuf else "sendbuf"
            raise ValueError(f"{what} {name} must hold {p} x {n} {block.dtype} elements, got "
                             f"{whole.size} {whole.dtype}")

    def peer_reads_agreed(self) -> None:
        """Size the broadcast plans (``plans.BROADCAST_PLAN_BYTES``) once every pid is in and
        the ranks agreed whether they read each other's memory (then large broadcasts read the
        root's buffer). The size picks the protocol, so every rank takes the same: plans stop
        at ``small_bytes`` where any rank's writer streams every large copy (``stream``, fixed
        at set-up). One on ``auto`` chooses later, alone, by timing: no peer could follow."""
        ctrl, layout = self.t.ctrl, self.layout
        streamed = any(ctrl[layout.rank_word(q, STORES)] == STREAMING
                       for q in range(self.world_size))
        least = single_copy.BROADCAST_MIN_BYTES.get(self.world_size)
        self.broadcast_plan_bytes = plans.broadcast_plan_bytes(
            self.world_size, self.small_bytes(), self.layout.workspace_bytes,
            least if self.t.peer_reads.usable else None, streamed)

    def summed_reduce_scatter_bytes(self) -> int:
        """The largest reduce-scatter input (bytes) run as the all-reduce of its copy."""
        return min(SUMMED_REDUCE_SCATTER_BYTES, self.small_bytes())

    def small_bytes(self) -> int:
        """The largest vector (bytes) an all-reduce or all-gather plan takes, and a broadcast
        plan at least (``broadcast_plan_bytes``); larger ones take ``direct``."""
        return min(direct.SMALL_BYTES, self.layout.workspace_bytes)

    # ----- one generation, as the algorithms take it ------------------------------------------
    def check_open(self, fp: Fingerprint) -> None:
        """Raise DistributedError if the transport was closed (its shared memory is gone)."""
        if self.closed:
            raise DistributedError("the shared-memory transport is closed", rank=self.rank,
                                   op=fp.op, seq=fp.seq)

    def begin(self, fp: Fingerprint, nbytes: int) -> tuple[int, int]:
        """Publish this rank's fingerprint for the next generation; return (gen, signature)."""
        sig = self.signature(fp, nbytes)
        gen = self.next_generation(fp, nbytes, sig)
        self.generation.publish(gen, sig, fp.seq)
        return gen, sig

    def next_generation(self, fp: Fingerprint, nbytes: int, sig: int) -> int:
        """The generation ``fp`` will run at, once it may write for it: the transport is
        open, a broadcast this rank left early is settled, and the half's header is ``fp``'s
        (``sig``). Nothing is published yet."""
        self.check_open(fp)
        if self.generation.left_early():
            self.settle_early(fp)
        gen = self.generation.gen + 1
        if self.header_sigs[gen & 1] != sig:
            self.publish_header(gen, fp, nbytes, sig)
        return gen

    def settle_early(self, fp: Fingerprint) -> None:
        """Before ``fp`` writes anything: wait for every peer to reach the generation this
        rank left early (a compiled broadcast's root, ``generation``), and raise
        CollectiveMismatchError naming that broadcast if a peer called something else there."""
        gen, peer = self.generation.settle(fp.op, fp.seq)
        if peer < 0:
            return
        start = self.layout.rank_header(self.rank, gen & 1)
        left, _ = unpack_header(bytes(self.t.shared[start:start + HEADER_SIZE]))
        self.mismatch(gen, left._replace(seq=self.generation.published(self.rank, gen)[1]),
                      peer)

    def sync(self, gen: int, fp: Fingerprint, sig: int = 0) -> None:
        """Arrive at ``gen``, wait for every rank; with ``sig``, check everyone's fingerprint."""
        g = self.generation
        if sig:
            peer = g.meet(gen, sig, fp.seq, fp.op)
            if peer >= 0:
                self.mismatch(gen, fp, peer)
        else:
            g.arrive(gen)
            g.wait(gen, fp.op, fp.seq)

    def signature(self, fp: Fingerprint, nbytes: int) -> int:
        """A nonzero 64-bit word that differs between collectives a rank must not mix up."""
        key = (fp.op, fp.dtype, fp.count, fp.group, nbytes)
        sig = self._sigs.get(key)
        if sig is None:
            if len(self._sigs) >= MAX_SIGNATURES:
                self._sigs.clear()
            # the whole op name too: the header holds its first 24 bytes only, and a forced
            # algorithm's mark with a tuning choice's suffix may run longer
            sig = self._sigs[key] = zlib.crc32(pack_header(fp._replace(seq=0), nbytes)
                                               + fp.op.encode()) + 1
        return sig

    def publish_header(self, gen: int, fp: Fingerprint, nbytes: int, sig: int) -> None:
        """Write the full header (what a peer decodes to name a mismatch) for ``gen``'s parity."""
        half = gen & 1
        start = self.layout.rank_header(self.rank, half)
        self.t.shared[start:start + HEADER_SIZE] = np.frombuffer(
            pack_header(fp._replace(seq=0), nbytes), np.uint8)
        self.header_sigs[half] = sig

    def mismatch(self, gen: int, fp: Fingerprint, peer: int) -> None:
        """Raise CollectiveMismatchError naming ``fp`` and what ``peer`` published at ``gen``;
        when the ranks differ only in the root they passed, naming every rank's root."""
        roots = self._roots(gen)
        if roots is not None:
            check_roots(roots, fp, self.t)
        start = self.layout.rank_header(peer, gen & 1)
        seq = self.generation.published(peer, gen)[1]
        try:
            got, nbytes = unpack_header(bytes(self.t.shared[start:start + HEADER_SIZE]))
            theirs = f"{got._replace(seq=seq).describe()} with {nbytes} bytes"
        except ValueError:
            theirs = "something that is not a direct shared-memory collective"
        raise CollectiveMismatchError(
            f"expected {fp.describe()} but peer rank {peer} called {theirs}: ranks called "
            "different collectives", rank=self.rank, peer=peer, op=fp.op, seq=fp.seq)

    def _roots(self, gen: int) -> Optional[list]:
        """Every rank's root when all ranks published the same rooted collective at ``gen``
        but for its root (every rank has arrived, so every header is in place); else None."""
        roots, rest = [], set()
        for q in range(self.world_size):
            start = self.layout.rank_header(q, gen & 1)
            try:
                got, nbytes = unpack_header(bytes(self.t.shared[start:start + HEADER_SIZE]))
            except ValueError:
                return None
            name, root = split_root(got.op)
            roots.append(root)
            rest.add((got._replace(op=name), nbytes, self.generation.published(q, gen)[1]))
        return roots if None not in roots and len(rest) == 1 else None

    # ----- the workspace ---------------------------------------------------------------------
    def views(self, dtype: np.dtype) -> tuple:
        """Typed views of the workspace: ``inputs[half][rank]`` and ``results[half]``."""
        views = self._views.get(dtype)
        if views is None:
            layout, size = self.layout, self.layout.workspace_bytes
            area = self._area
            inputs = [[area(layout.ws_input(h, r), size, dtype) for r in range(self.world_size)]
                      for h in (0, 1)]
            results = [area(layout.ws_result(h), size, dtype) for h in (0, 1)]
            views = self._views[dtype] = (inputs, results)
        return views

    def half_inputs(self, half: int) -> np.ndarray:
        """Every input area of one half as one byte vector (they lie back to back)."""
        size = self.world_size * self.layout.workspace_bytes
        return self._area(self.layout.ws_input(half, 0), size, np.dtype(np.uint8))

    def workspace_rows(self, dtype: np.dtype) -> np.ndarray:
        """The whole workspace as rows of its areas, row ``half * (p + 1) + r`` being rank r's
        input area of that half (the compiled plans index it so)."""
        rows = 2 * (self.world_size + 1)
        whole = self._area(self.layout.ws_input(0, 0), rows * self.layout.workspace_bytes, dtype)
        return whole.reshape(rows, -1)

    def control_words(self) -> np.ndarray:
        """The control lines as an int64 array (the compiled plans poll them)."""
        return self.t.shared[:self.layout.rank_headers_at].view(np.int64)

    def _area(self, start: int, nbytes: int, dtype: Optional[np.dtype]) -> np.ndarray:
        return self.t.shared[start:start + nbytes].view(dtype)

    def close(self) -> None:
        """Drop every view of the segment, so the transport can unmap it."""
        self.closed = True
        self.short_calls.clear()
        self.pair_rounds.clear()
        self.plans.clear()
        self._views.clear()
