"""Storage for DDP's flat gradient buckets: private arrays, or buckets in shared memory.

``bucket_storage`` gives DDP one flat array per bucket, behind one interface (see
``PrivateBuckets``). By default they are private arrays and each bucket is averaged by
``collectives.all_reduce``. When the group is the whole world of an ``shm`` transport, a
``shared_buckets.SharedBucketArena`` serves instead, averaging the buckets in place in one
shared segment.
"""
from __future__ import annotations

import zlib
from typing import List, Optional, Sequence

import numpy as np

from ...backends.numba_kernels import cast_to_float16
from .. import algorithms, collectives, object_collectives
from ..buffers import copy_from_host
from ..group.world import ProcessGroup, resolve_group
from ..reduce_ops import ReduceOp
from .shared_buckets import SharedBucketArena, SharedBucketsUnavailable, Spec


class PrivateBuckets:
    """One private zeroed array per bucket, averaged by ``collectives.all_reduce``.

    The interface DDP uses, shared with ``SharedBucketArena``, in this order every sync:
    ``acquire()`` before the first pack, ``all_reduce(index)`` once bucket ``index`` is packed
    (returns the ``Work``), ``unpack(index, params, offsets, keep)`` once that work is done, and
    ``release()`` after the last unpack.
    """

    shared = False

    def __init__(self, pg: Optional[ProcessGroup], specs: Sequence[Spec],
                 compress: bool = False) -> None:
        self._group, self._compress = pg, compress
        self.flats = [np.zeros(n, dtype=dt) for n, dt in specs]
        # float16 copies sent instead of the buckets when compressing (PyTorch's fp16 hook)
        self._wire: List[Optional[np.ndarray]] = [None] * len(self.flats)

    def acquire(self) -> None:
        """Nothing to wait for: no other rank reads these arrays."""

    def all_reduce(self, index: int):
        """Start averaging packed bucket ``index`` over the group; returns the ``Work``."""
        wire = flat = self.flats[index]
        if self._compress and flat.dtype != np.float16:
            # Half the bytes on the wire; the average is taken in float16.
            if self._wire[index] is None:
                self._wire[index] = np.empty(flat.size, dtype=np.float16)
            wire = self._wire[index]
            if flat.dtype == np.float32:
                cast_to_float16(flat, out=wire)  # Numba: ~3.7x NumPy's cast
            else:
                np.copyto(wire, flat, casting="same_kind")
        return collectives.all_reduce(wire, ReduceOp.AVERAGE, group=self._group, async_op=True)

    def unpack(self, index: int, params: Sequence, offsets: Sequence[int],
               keep: Optional[np.ndarray] = None) -> None:
        """Copy the averaged bucket into ``params[j].grad`` (None where ``keep[j]`` is False)."""
        flat = self.flats[index]
        if self._wire[index] is not None:
            np.copyto(flat, self._wire[index])
        for j, param in enumerate(params):
            if keep is not None and not keep[j]:
                param.grad = None
            else:
                view = flat[offsets[j]:offsets[j + 1]].reshape(param.data.shape)
                param.grad = copy_from_host(view, param.data, out=param.grad)

    def release(self) -> None:
        """Nothing to announce: no other rank reads these arrays."""


def _forced_algorithm() -> Optional[str]:
    """The all-reduce algorithm the environment forces, if it is not shared memory's own."""
    choice = algorithms.environment_choice()
    if choice is None:
        return None
    try:
        name = algorithms.normalize("all_reduce", choice)
    except (TypeError, ValueError):
        return None  # the collectives raise, naming the bad value
    return None if name in ("auto", "shm_direct", "native") else name


def shared_bucket_obstacle(pg: ProcessGroup, specs: Sequence[Spec],
                           gradient_compression: bool) -> Optional[str]:
    """Why shared buckets cannot serve this DDP, or None when they can."""
    if gradient_compression:
        return "gradient_compression=True all-reduces float16 copies, not the buckets"
    forced = _forced_algorithm()
    if forced is not None:
        return (f"{algorithms.ENV_ALLREDUCE_ALGO}={forced} asks for the {forced} all-reduce, "
                "not shared memory's own")
    t = pg.transport
    if t is None or t.name != "shm" or t.native_collectives() is None or t.world_size != pg.size:
        return (f"the group (ranks {list(pg.ranks)}, backend {pg.backend!r}) is not the whole "
                "world of an shm transport")
    for n, dt in specs:
        if np.dtype(dt).kind != "f":
            return f"a bucket of {n} x {np.dtype(dt).name} cannot be averaged"
    return None


def bucket_storage(group: Optional[ProcessGroup], specs: Sequence[Spec],
                   shared: Optional[bool] = None, gradient_compression: bool = False):
    """The flat arrays of DDP's buckets: a ``SharedBucketArena`` or ``PrivateBuckets``.

    ``shared``: None picks shared buckets whenever they can serve (falling back to private
    ones when the segment cannot be set up), True insists (ValueError naming the obstacle),
    False never uses them. Every rank must pass the same value and bucket layout.
    """
    if shared is not None and not isinstance(shared, bool):
        raise TypeError(f"shared_buckets must be None, True or False, got {shared!r}")
    specs = [(int(n), np.dtype(dt)) for n, dt in specs]
    pg = resolve_group(group)
    if pg.size == 1:
        return PrivateBuckets(pg, specs)  # nothing to communicate
    layout = zlib.crc32(repr([(n, dt.str) for n, dt in specs]).encode())
    object_collectives.check_same_everywhere(
        pg, "ddp_bucket_layout", [{None: 0, False: 1, True: 2}[shared], layout],
        f"DistributedDataParallel buckets (shared_buckets={shared}, {len(specs)} buckets)")
    obstacle = shared_bucket_obstacle(pg, specs, gradient_compression)
    if obstacle is not None:
        if shared:
            raise ValueError(f"shared_buckets=True cannot be used: {obstacle}")
        return PrivateBuckets(pg, specs, gradient_compression)
    if shared is False:
        return PrivateBuckets(pg, specs, gradient_compression)
    try:
        return SharedBucketArena.open(pg, specs)
    except SharedBucketsUnavailable:
        if shared:
            raise
        return PrivateBuckets(pg, specs, gradient_compression)  # every rank saw the same failure
