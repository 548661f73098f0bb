"""Storage for DDP's flat gradient buckets: private arrays, or buckets in shared memory.

``bucket_storage`` gives DDP one flat array per bucket, behind one interface (see
``PrivateBuckets``). By default they are private arrays and each bucket is averaged by
``collectives.all_reduce``. When the group is the whole world of an ``shm`` transport, a
``shared_buckets.SharedBucketArena`` serves instead, averaging the buckets in place in one
shared segment (holding float16 copies of wider buckets under ``fp16_compress_hook``).
"""
from __future__ import annotations

import contextlib
import zlib
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from .. import algorithms, collectives
from ..collectives import objects as object_collectives
from ..buffers import copy_from_host
from ..comm_hooks.default_hooks import averaging_here
from ..group.shm_world import is_whole_shm_world
from ..group.world import ProcessGroup, resolve_group
from ..reduce_ops import ReduceOp
from ..work import Work
from .shared_buckets import SharedBucketArena, SharedBucketsUnavailable, Spec
from .wire import unpack_gradient


def group_parameters(params: Sequence, cap_bytes: int) -> List[Tuple[list, np.dtype]]:
    """DDP's buckets: ``(parameters, dtype)`` each, one dtype per bucket, filled in reverse
    registration order (roughly the order backward produces the gradients) until a bucket
    holds at least ``cap_bytes``; then the unfilled ones, one per dtype."""
    groups: List[Tuple[list, np.dtype]] = []
    current: Dict[np.dtype, list] = {}
    sizes: Dict[np.dtype, int] = {}
    for p in reversed(list(params)):
        dt = p.array.dtype
        current.setdefault(dt, []).append(p)
        sizes[dt] = sizes.get(dt, 0) + p.array.nbytes
        if sizes[dt] >= cap_bytes:
            groups.append((current.pop(dt), dt))
            sizes[dt] = 0
    return groups + [(group, dt) for dt, group in current.items()]


class PrivateBuckets:
    """One private zeroed array per bucket, averaged by ``collectives.all_reduce``, or by a
    communication hook once ``use_comm_hook`` installed one.

    The interface DDP uses, shared with ``SharedBucketArena``, in this order every sync:
    ``acquire()`` before the first pack, ``all_reduce(index)`` once bucket ``index`` is packed
    (returns something to ``wait()`` on), ``unpack(index, params, offsets, keep)`` once that is
    done, and ``release()`` after the last unpack.
    """

    shared = False
    copies_on_queue = False  # DDP packs and unpacks: a hook's collectives run on the queue

    def __init__(self, pg: Optional[ProcessGroup], specs: Sequence[Spec],
                 grads_as_views: bool = False) -> None:
        self._group = pg
        self.flats = [np.zeros(n, dtype=dt) for n, dt in specs]
        self._dtypes = [np.dtype(dt) for _, dt in specs]  # the parameters' (a wire may differ)
        # PyTorch's gradient_as_bucket_view: unpacking points ``.grad`` at the bucket instead
        # of copying into it, so the gradients take no memory besides the buckets.
        self._grads_as_views = grads_as_views
        self._hook: Optional[Callable[[int, np.ndarray], Any]] = None
        self._futures: List[Any] = [None] * len(self.flats)  # the hook's, per bucket

    def use_comm_hook(self, run: Callable[[int, np.ndarray], Any],
                      wires: Optional[Sequence[Optional[np.dtype]]] = None) -> None:
        """From now on ``run(index, flat)`` averages a bucket: it returns a future (``wait()``
        gives an array of the bucket's size: the average, or an approximation of it).
        ``wires[index]``, where not None, is the dtype bucket ``index`` holds from now on
        instead of its parameters': DDP packs into it and unpacks from it, casting (``wire``),
        and ``run`` gets the bucket in that dtype."""
        wires = list(wires or [])
        if self._grads_as_views and any(w is not None for w in wires):
            raise ValueError("gradient_as_bucket_view=True needs buckets of the parameters' "
                             f"dtype, got wire dtypes {wires}")
        for index, wire in enumerate(wires):
            if wire is not None and np.dtype(wire) != self.flats[index].dtype:
                self.flats[index] = np.zeros(self.flats[index].size, dtype=wire)
        self._hook = run

    def acquire(self) -> None:
        """Nothing to wait for: no other rank reads these arrays."""

    def all_reduce(self, index: int, here: bool = False):
        """Start averaging packed bucket ``index`` over the group; returns the ``Work`` (or the
        hook's future). ``here``: the caller would only wait for it, so DDP's own average and
        the plain hooks (``averaging_here``) average on the calling thread instead of queueing
        it; a finished ``Work`` (or future) then comes back."""
        flat = self.flats[index]
        if self._hook is None:
            if here:
                collectives.all_reduce(flat, ReduceOp.AVERAGE, group=self._group)
                return Work.completed("all_reduce", flat, self._group.rank)
            return collectives.all_reduce(flat, ReduceOp.AVERAGE, group=self._group,
                                          async_op=True)
        with averaging_here() if here else contextlib.nullcontext():
            future = self._futures[index] = self._hook(index, flat)
        if not callable(getattr(future, "wait", None)):
            raise TypeError(f"the communication hook returned {type(future).__name__} for bucket "
                            f"{index}; it must return a future (an object with wait())")
        return future

    def unpack(self, index: int, params: Sequence, offsets: Sequence[int],
               keep: Optional[np.ndarray] = None) -> None:
        """Copy the averaged bucket into ``params[j].grad`` (None where ``keep[j]`` is False)."""
        flat, dtype = self.flats[index], self._dtypes[index]
        if self._hook is not None:
            self._take_result(index, flat)
        for j, param in enumerate(params):
            if keep is not None and not keep[j]:
                param.grad = None
            elif flat.dtype != dtype:  # a narrower wire: widened while copied out
                param.grad = unpack_gradient(flat[offsets[j]:offsets[j + 1]], param, dtype)
            else:
                view = flat[offsets[j]:offsets[j + 1]].reshape(param.array.shape)
                if self._grads_as_views and type(param.array) is np.ndarray:
                    param.grad = view  # the next backward accumulates into the bucket
                else:
                    into = None if param.grad is None else param.grad.array
                    param.grad = copy_from_host(view, param.array, out=into)

    def _take_result(self, index: int, flat: np.ndarray) -> None:
        future, self._futures[index] = self._futures[index], None
        result = future.wait()
        if result is flat:
            return
        result = np.asarray(result)
        if result.size != flat.size:
            raise ValueError(f"the communication hook returned {result.size} values for bucket "
                             f"{index}, which holds {flat.size} gradients")
        np.copyto(flat, result.reshape(-1), casting="same_kind")

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
                           comm_hook: Optional[str] = None) -> Optional[str]:
    """Why shared buckets cannot serve this DDP, or None when they can. ``comm_hook`` names
    the communication hook that will average the buckets, if any: a hook runs its own
    collectives on private arrays."""
    if comm_hook is not None:
        return f"{comm_hook} averages the buckets, not shared memory"
    forced = _forced_algorithm()
    if forced is not None:
        return (f"{algorithms.ENV_ALLREDUCE_ALGO}={forced} asks for the {forced} all-reduce, "
                "not shared memory's own")
    if not is_whole_shm_world(pg):
        return (f"the group (ranks {list(pg.ranks)}, backend {pg.backend!r}) is not the whole "
                "world of an shm transport")
    for n, dt in specs:
        if np.dtype(dt).kind != "f":
            return f"a bucket of {n} x {np.dtype(dt).name} cannot be averaged"
    return None


def bucket_storage(group: Optional[ProcessGroup], specs: Sequence[Spec],
                   shared: Optional[bool] = None, comm_hook: Optional[str] = None,
                   grads_as_views: bool = False,
                   wires: Optional[Sequence[Optional[np.dtype]]] = None):
    """The flat arrays of DDP's buckets: a ``SharedBucketArena`` or ``PrivateBuckets``.

    ``shared``: None picks shared buckets whenever they can serve (falling back to private
    ones when the segment cannot be set up), True insists (ValueError naming the obstacle),
    False never uses them; ``comm_hook`` (the name of a hook that will average the buckets)
    and ``grads_as_views`` (gradients that are views of private buckets) rule them out.
    ``wires[i]``, where not None, is the narrower dtype shared bucket ``i`` holds (private
    buckets take theirs from ``use_comm_hook``). Every rank must pass the same value and
    bucket layout.
    """
    if shared is not None and not isinstance(shared, bool):
        raise TypeError(f"shared_buckets must be None, True or False, got {shared!r}")
    specs = [(int(n), np.dtype(dt)) for n, dt in specs]
    pg = resolve_group(group)
    if pg.size == 1:  # nothing to communicate: no hook, no packing (a hook runs on one too)
        return PrivateBuckets(pg, specs if comm_hook else [(0, dt) for _, dt in specs],
                              grads_as_views and bool(comm_hook))
    if grads_as_views:
        if shared:
            raise ValueError("shared_buckets=True cannot be used with gradient_as_bucket_view="
                             "True: the averaged gradients of shared buckets lie in every "
                             "rank's copy, so they cannot be one view each")
        shared = False
    wires = [None if w is None else np.dtype(w) for w in (wires or [None] * len(specs))]
    held = [(n, dt if w is None else w) for (n, dt), w in zip(specs, wires)]
    layout = zlib.crc32(repr([(n, dt.str) for n, dt in held]).encode())
    object_collectives.check_same_everywhere(
        pg, "ddp_bucket_layout", [{None: 0, False: 1, True: 2}[shared], layout],
        f"DistributedDataParallel buckets (shared_buckets={shared}, {len(specs)} buckets)")
    obstacle = shared_bucket_obstacle(pg, held, comm_hook)
    if obstacle is not None:
        if shared:
            raise ValueError(f"shared_buckets=True cannot be used: {obstacle}")
        return PrivateBuckets(pg, specs, grads_as_views)
    if shared is False:
        return PrivateBuckets(pg, specs, grads_as_views)
    try:
        return SharedBucketArena.open(pg, held, [dt for _, dt in specs])
    except SharedBucketsUnavailable:
        if shared:
            raise
        return PrivateBuckets(pg, specs)  # every rank saw the same failure
