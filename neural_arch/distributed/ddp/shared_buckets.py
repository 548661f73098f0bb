"""DDP's gradient buckets in shared memory (chosen by ``buckets.bucket_storage``).

On the whole world of an ``shm`` transport, a ``SharedBucketArena`` maps one segment holding
every rank's buckets: packing gradients writes straight into shared memory, and averaging a
bucket copies nothing in or out of a workspace:

1. barrier: every rank has packed the bucket;
2. rank r sums slice r of the bucket over all ranks' copies, in rank order 0..p-1 (the order
   of the direct all-reduce, so results are bit-identical to it), divides by p, and writes the
   result over slice r of its own copy;
3. unpacking reads slice q of the result from rank q's copy. A bucket's slices are final once
   every rank has arrived at the next bucket's barrier, so only the last bucket of a sync ends
   with a barrier of its own.

A bucket may hold a narrower float than its parameters (``wire``: the float16 copies of
``fp16_compress_hook``): packing rounds each gradient into it, step 2 adds the p float16
values in float32 and rounds the mean once (``reductions.kernels.sum_halves``, as the direct
all-reduce of float16 does), and unpacking widens. Buckets of float16 parameters sum the same
way.

A bucket that DDP's hooks launch during backward (``all_reduce(index, bucket)``) holds final
gradients, so the queue's thread packs it before step 1 and unpacks it once its slices are
final (right after the next bucket's reduction, or after the last barrier): backward's thread
copies nothing, and the copies, most of the work of a sync, run beside backward instead of
inside it. NumPy releases the GIL while it copies and adds large arrays, so they can run on a
core of their own.

One copy per rank suffices: before the first pack of a sync, a rank waits until every peer
has announced (``release``) that it finished unpacking the previous sync, since unpacking
reads the other ranks' copies. That wait almost never blocks (peers released before their
forward pass), and it keeps the segment at the size of the private buckets it replaces.

The arena runs the shared-memory barrier (``transports.shm.Generation``) on control lines of
its own segment, apart from the transport's, so it composes with the direct collectives queued
around it. The segment's layout and its creation are in ``shared_segment``.
Every wait is bounded by the group's timeout and watches the peers' liveness. Memory ordering
is that of ``transports.shm``: data is written before the counter that publishes it, and read
after the counter was seen (enough on x86-64).
"""
from __future__ import annotations

import zlib
from typing import List, Optional, Sequence

import numpy as np

from ..buffers import copy_from_host
from ..errors import CollectiveMismatchError, DistributedError
from ..group.process_group import ProcessGroup
from ..reduce_ops import averager
from ..reductions.kernels import sum_halves, to_float32
from ..transports.shm import Generation
from ..transports.shm.layout import LINE_WORDS, SPARE
from ..transports.shm.waiting import wait_ge
# SharedBucketsUnavailable is re-exported: ``buckets`` falls back to private buckets on it.
from .shared_segment import SegmentLayout, SharedBucketsUnavailable, Spec, open_segment, slices

OP = "shared_bucket_all_reduce"
ACQUIRE_OP = "shared_bucket_acquire"
MEET_OP = "shared_bucket_meet"
RELEASED = SPARE  # the word of a rank's control line counting syncs it finished reading
CHUNK_BYTES = 256 << 10     # partial sums stay in cache while the next rank's slice is added
_FINISH = "end of a sync"


class SharedBucketArena:
    """Every rank's buckets in one shared segment; see the module docstring."""

    shared = True
    copies_on_queue = True  # all_reduce(index, bucket): see the module docstring

    def __init__(self, pg: ProcessGroup, specs: Sequence[Spec], mm, name: str,
                 dtypes: Optional[Sequence[np.dtype]] = None) -> None:
        self._pg, self._t, self._mm = pg, pg.transport, mm
        self.segment_name = name
        p, rank = pg.size, pg.rank
        self._rank, self._size = rank, p
        self._peers = tuple(q for q in range(p) if q != rank)
        layout = SegmentLayout(p, specs)
        self._ctrl = memoryview(mm)[:layout.ctrl_bytes].cast("q")
        raw = np.frombuffer(mm, np.uint8)
        self._generation = Generation(self._ctrl, raw.ctypes.data, rank, p, self._t)
        self._views = [[raw[layout.bucket(q, i):layout.bucket(q, i) + n * np.dtype(dt).itemsize]
                        .view(dt) for i, (n, dt) in enumerate(specs)] for q in range(p)]
        self.flats = self._views[rank]  # this rank's buckets: DDP packs gradients into them
        # the parameters' dtype of each bucket; ``wires[i]`` the narrower one it holds, or None
        self._dtypes = [np.dtype(d) for d in (dtypes or [dt for _, dt in specs])]
        self.wires = [None if np.dtype(dt) == d else np.dtype(dt)
                      for (_, dt), d in zip(specs, self._dtypes)]
        self._bounds = [slices(n, p, np.dtype(dt).itemsize) for n, dt in specs]
        labels = [f"bucket {i} ({n} x {np.dtype(dt).name})" for i, (n, dt) in enumerate(specs)]
        self._sigs = [self._signature(label) for label in labels]
        self._finish_sig = self._signature(_FINISH)
        self._labels = dict(zip(self._sigs + [self._finish_sig], labels + [_FINISH]))
        self._scratch: dict = {}
        self._released = 0   # syncs whose results this rank finished reading
        self._acquired = False
        self._to_unpack: List = []  # queue-packed buckets whose slices are not final yet

    @staticmethod
    def _signature(what: str) -> int:
        return zlib.crc32(what.encode()) + 1  # never 0, the value of an unwritten word

    # ----- the calls DDP makes, in this order each sync ------------------------------------
    def acquire(self) -> None:
        """Before the first pack of a sync: wait until every peer finished reading the last."""
        if self._acquired:
            return
        self._check_open(ACQUIRE_OP, self._released + 1)
        ctrl, target = self._ctrl, self._released
        for peer in self._peers:
            word = peer * LINE_WORDS + RELEASED
            if ctrl[word] < target:
                wait_ge(ctrl, word, target, peer, self._t.watch, self._t.timeout, ACQUIRE_OP,
                        target + 1, f"peer rank {peer} to finish reading sync {target}")
        self._acquired = True

    def all_reduce(self, index: int, bucket=None):
        """Average packed bucket ``index`` in the group's queue; returns the ``Work``.
        Buckets must be launched in index order, all of them, every sync. ``bucket``: DDP's
        bucket of final host gradients, which the queue's thread packs (``bucket.pack()``)
        and unpacks into ``bucket.params`` itself (the caller does neither)."""
        pg = self._pg
        pg.check_usable(OP)
        flat = self.flats[index]
        fp = pg.fingerprint(OP, flat.dtype, flat.size)
        last = index == len(self.flats) - 1
        return pg.run(lambda: self._reduce_bucket(index, fp.seq, last, bucket), True, fp, OP)

    def unpack(self, index: int, params: Sequence, offsets: Sequence[int],
               keep: Optional[np.ndarray] = None) -> None:
        """Copy the averaged bucket into ``params[j].grad`` (None where ``keep[j]`` is False),
        widened to the parameters' dtype where the bucket holds a narrower one."""
        dtype = self._dtypes[index]
        for j, param in enumerate(params):
            if keep is not None and not keep[j]:
                param.grad = None
                continue
            lo, hi = offsets[j], offsets[j + 1]
            grad = None if param.grad is None else param.grad.array
            on_host = isinstance(param.array, np.ndarray)
            if grad is None and on_host:
                grad = param.grad = np.empty(param.array.shape, dtype=dtype)
            if isinstance(grad, np.ndarray) and grad.flags.c_contiguous:
                self.gather(index, lo, hi, grad.reshape(-1))
            else:  # a strided or a GPU gradient: gathered on the host, then copied over
                staged = np.empty(hi - lo, dtype=dtype)
                self.gather(index, lo, hi, staged)
                param.grad = copy_from_host(staged.reshape(param.array.shape), param.array,
                                            out=grad)

    def release(self) -> None:
        """After unpacking: tell the peers this rank no longer reads their copies."""
        self._to_unpack.clear()  # empty unless a sync failed halfway
        self._released += 1
        self._acquired = False
        self._ctrl[self._rank * LINE_WORDS + RELEASED] = self._released

    # ----- reading the result --------------------------------------------------------------
    def gather(self, index: int, lo: int, hi: int, out: np.ndarray) -> None:
        """Elements ``lo:hi`` of averaged bucket ``index`` into ``out``, each slice read from
        the rank that reduced it (a float16 bucket widened into float32 by the compiled cast)."""
        widen = self.flats[index].dtype == np.float16 and out.dtype == np.float32
        for q, (start, stop) in enumerate(self._bounds[index]):
            a, b = max(start, lo), min(stop, hi)
            if a < b:
                if widen:
                    to_float32(self._views[q][index][a:b], out[a - lo:b - lo])
                else:
                    out[a - lo:b - lo] = self._views[q][index][a:b]

    # ----- passing values on after a sync (ZeRO's updated parameters) ---------------------
    def copy_of(self, rank: int, index: int) -> np.ndarray:
        """Group rank ``rank``'s copy of bucket ``index`` in the segment. Between the last
        unpack of a sync and ``release()``, a rank may write over its own copy, once every
        peer has read its slices (``meet``), to hand values to the others."""
        return self._views[rank][index]

    def publish_written(self, count: int) -> None:
        """Tell the peers this rank has now written ``count`` pieces into its copies in all
        (a count that only grows, kept by the caller; data first, then the count)."""
        self._ctrl[self._written_word(self._rank)] = count

    def wait_written(self, rank: int, count: int, what: str) -> None:
        """Wait until group rank ``rank`` has published ``count`` pieces written."""
        wait_ge(self._ctrl, self._written_word(rank), count, rank, self._t.watch,
                self._t.timeout, MEET_OP, None, what)

    def _written_word(self, rank: int) -> int:
        """On the rank's line of counts, after the barrier's lines (``shared_segment``)."""
        return (self._size + rank) * LINE_WORDS

    def meet(self, what: str) -> None:
        """A barrier of the group on the segment's own lines, for the calling thread once
        every bucket of the sync was waited for; every rank calls it with the same ``what``
        (a mismatch raises, naming both)."""
        self._check_open(MEET_OP, 0)
        fp = self._pg.fingerprint(MEET_OP, np.uint8, 0)
        sig = self._signature(what)
        self._labels.setdefault(sig, what)
        self._barrier(sig, fp.seq, what)

    # ----- on the queue's thread -----------------------------------------------------------
    def _reduce_bucket(self, index: int, seq: int, last: bool, bucket=None) -> None:
        self._check_open(OP, seq)
        try:
            if bucket is not None:
                self.acquire()
                bucket.pack()
            self._barrier(self._sigs[index], seq, f"every rank to pack bucket {index}")
            lo, hi = self._bounds[index][self._rank]
            if hi > lo:
                self._reduce_slice(index, lo, hi)
            # every rank reduced the buckets before this one: their slices are final
            self._unpack_waiting()
            if bucket is not None:
                self._to_unpack.append(bucket)
            if last:
                self._barrier(self._finish_sig, seq,
                              "every rank to reduce its slice of the buckets")
                self._unpack_waiting()
        except BaseException:
            self._to_unpack.clear()
            raise

    def _unpack_waiting(self) -> None:
        while self._to_unpack:
            bucket = self._to_unpack.pop(0)
            self.unpack(bucket.index, bucket.params, bucket.offsets)

    def _reduce_slice(self, index: int, lo: int, hi: int) -> None:
        copies = [self._views[q][index] for q in range(self._size)]
        mine = copies[self._rank]
        dtype = mine.dtype
        step = max(1, CHUNK_BYTES // dtype.itemsize)
        if dtype == np.float16:  # all p added in float32, the mean rounded once; in place
            for a in range(lo, hi, step):
                b = min(a + step, hi)
                sum_halves(mine[a:b], [c[a:b] for c in copies], self._size)
            return
        scale, factor = averager(dtype, self._size)
        # Ranks 0 and 1 may sum into their own copy (each element is read before it is
        # written); a later rank's own addend would be overwritten first, so it sums aside.
        scratch = None
        if self._rank >= 2:
            scratch = self._scratch.get(dtype)
            if scratch is None:
                scratch = self._scratch[dtype] = np.empty(step, dtype=dtype)
        for a in range(lo, hi, step):
            b = min(a + step, hi)
            acc = mine[a:b] if scratch is None else scratch[:b - a]
            np.add(copies[0][a:b], copies[1][a:b], out=acc)
            for other in copies[2:]:
                np.add(acc, other[a:b], out=acc)
            scale(acc, factor, out=mine[a:b])

    def _barrier(self, sig: int, seq: int, what: str) -> None:
        g = self._generation
        gen = g.gen + 1
        g.publish(gen, sig, seq)
        peer = g.meet(gen, sig, seq, OP, what)
        if peer >= 0:
            their_sig, their_seq = g.published(peer, gen)
            theirs = self._labels.get(their_sig, "an unknown bucket layout")
            raise CollectiveMismatchError(
                f"expected {self._labels[sig]} at #{seq} but peer rank {peer} is at {theirs} "
                f"#{their_seq}: ranks are out of step (they issued different collectives before "
                "this one)", rank=self._rank, peer=peer, op=OP, seq=seq)

    def _check_open(self, op: str, seq: int) -> None:
        if self._t.closed:
            raise DistributedError("the shared-memory transport is closed; shared buckets can no "
                                   "longer be synchronised", rank=self._rank, op=op, seq=seq)

    # ----- setting up ----------------------------------------------------------------------
    @classmethod
    def open(cls, pg: ProcessGroup, specs: Sequence[Spec],
             dtypes: Optional[Sequence[np.dtype]] = None) -> "SharedBucketArena":
        """Group rank 0 creates the segment, every rank maps it, then its name is unlinked.
        ``specs`` give what each bucket holds; ``dtypes`` its parameters' dtypes, where wider."""
        name, mm = open_segment(pg, SegmentLayout(pg.size, specs).total_bytes, OP)
        return cls(pg, specs, mm, name, dtypes)
