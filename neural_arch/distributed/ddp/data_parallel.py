"""DistributedDataParallel: every rank keeps a full replica and gradients are averaged.

Gradients are packed into flat buckets of about ``bucket_size_mb`` (parameters taken in reverse
registration order, which is roughly the order backward produces them), and each bucket is
all-reduced as one message: a few large collectives cost far less than one per parameter.

Two ways to synchronise:
- automatic (default, PyTorch's semantics): hooks on the parameters launch each bucket's
  all-reduce in the background as soon as backward has produced all of its gradients,
  overlapping communication with the rest of backward, and a callback queued for the end of
  backward (``autograd.queue_callback``) waits for them and unpacks: gradients are averaged by
  the time ``loss.backward()`` returns, and ``sync_gradients()`` after it does nothing. On
  shared buckets the communication thread packs and unpacks those buckets too (the copies
  are most of the work), so that backward's thread does none of it; ``comm_stats()`` tells
  the communication waited for after backward from the part hidden under it (``bucket``);
- explicit (``auto_sync=False``): call ``sync_gradients()`` after ``loss.backward()``. A
  forward or a second backward after gradients that were never synchronised (outside
  ``no_sync()``) raises instead of letting the replicas drift apart.

Bucket storage comes from ``buckets.bucket_storage``, private or shared behind one interface:
on the whole world of an ``shm`` transport the buckets live in shared memory
(``shared_buckets``), so gradients are packed straight into the segment the averaging reads
and nothing is copied in or out of a workspace.

``register_comm_hook(state, hook)`` (PyTorch's) replaces the average of each bucket by
``hook(state, bucket)``, which may compress (``distributed.comm_hooks``: float16, PowerSGD,
top-k). The hook plugs into the storage's ``all_reduce``/``unpack``, so the buckets are packed,
launched during backward and unpacked exactly as without one; only private buckets can host
it (a hook runs collectives of its own), so shared ones are given up when a hook is registered.
``gradient_compression=True`` registers ``fp16_compress_hook``.

``naive.py`` holds the idea in its simplest form (one all-reduce per parameter).
"""
from __future__ import annotations

import contextlib
import time
import weakref
import zlib
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ...core import autograd
from ...nn import Module
from .. import collectives, object_collectives
from ..comm_hooks.bucket import GradBucket
from ..comm_hooks.default_hooks import fp16_compress_hook
from ..group.world import get_world_size, is_initialized, resolve_group
from ..reduce_ops import ReduceOp
from ..replicas import broadcast_module_state, check_replicas_agree
from .bucket import Bucket, SyncTimes
from .buckets import bucket_storage


_FP16 = "gradient_compression=True (the float16 communication hook)"


def _weak_hook(ddp: "DistributedDataParallel"):
    """The gradient hook, holding DDP weakly: parameters outlive a wrapper that was dropped
    (re-wrapped, say), and a dropped one must neither be kept alive nor keep syncing."""
    ref = weakref.ref(ddp)

    def hook(param) -> None:
        owner = ref()
        if owner is not None:
            owner._grad_ready(param)
    return hook


def _remove_all(handles) -> None:
    for handle in handles:
        handle.remove()


class DistributedDataParallel(Module):
    """Data-parallel wrapper; see the module docstring. ``.module`` is the wrapped model.

    ``shared_buckets``: None (default) keeps the buckets in shared memory whenever the group
    is the whole world of an ``shm`` transport and no communication hook is registered; True
    requires it (ValueError where it cannot work; a single process has nothing to share);
    False never does. ``.shared_buckets`` tells whether they are in use.

    ``gradient_as_bucket_view`` (PyTorch's): after a sync each ``.grad`` is a view of its
    private bucket rather than a copy, so gradients cost no memory besides the buckets (and
    the next backward accumulates straight into them); it rules out shared buckets.
    """

    def __init__(self, module: Module, device: Optional[str] = None,
                 gradient_compression: bool = False, bucket_size_mb: float = 25,
                 find_unused_parameters: bool = False, auto_sync: bool = True,
                 group=None, broadcast_buffers: bool = True,
                 shared_buckets: Optional[bool] = None, device_ids: Optional[list] = None,
                 output_device=None, gradient_as_bucket_view: bool = False) -> None:
        # torch's device_ids / output_device: a CPU module takes None (or []), as in torch
        if (device_ids or output_device is not None) and all(
                p.device == "cpu" for p in module.parameters()):
            raise ValueError(f"DistributedDataParallel(device_ids={device_ids!r}, output_device="
                             f"{output_device!r}): the module is on the CPU, leave both None")
        super().__init__()
        if not is_initialized():
            raise RuntimeError("DistributedDataParallel needs an initialized process group: call "
                               "init_process_group() first")
        if bucket_size_mb <= 0:
            raise ValueError(f"bucket_size_mb must be > 0, got {bucket_size_mb}")
        self.module = module
        self.device = device
        self.gradient_compression = gradient_compression
        self.find_unused_parameters = find_unused_parameters
        self.auto_sync = auto_sync
        self.broadcast_buffers = broadcast_buffers
        self.gradient_as_bucket_view = bool(gradient_as_bucket_view)
        self._group = group
        self._world = get_world_size(group)
        self._sync_enabled = True
        self._started = False   # a backward or a sync happened: too late for a comm hook
        self._hook_name: Optional[str] = None
        self._names: Dict[int, str] = {id(p): n for n, p in module.named_parameters()}
        self._params = [p for _, p in module.named_parameters() if p.requires_grad]
        self._check_replicas_agree()
        self._broadcast_state()
        self._shared_request = shared_buckets
        self._buckets = self._build_buckets(int(bucket_size_mb * 2 ** 20), shared_buckets)
        self.shared_buckets = self._storage.shared  # averaged in one shared segment
        if gradient_compression:
            self.register_comm_hook(group, fp16_compress_hook)
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._next_launch = 0
        self._backward = None   # the backward the hooks last saw (autograd.current_backward)
        self._averaged = False  # the last backward's callback averaged the gradients
        self._unsynced = None   # explicit mode: (count, first name) of gradients never synced
        self._fresh = 0         # gradients this backward produced outside no_sync()
        self._first_fresh = "?"
        self._sync_times = SyncTimes()
        # Also in explicit mode: there the hooks only watch for a forgotten sync_gradients().
        self._hook_handles = [p.register_post_accumulate_grad_hook(_weak_hook(self))
                              for p in self._params]
        weakref.finalize(self, _remove_all, list(self._hook_handles))

    # -- construction ---------------------------------------------------------------------
    def _check_replicas_agree(self) -> None:
        check_replicas_agree(self.module, self._group, "DistributedDataParallel")

    def _broadcast_state(self) -> None:
        broadcast_module_state(self.module, self._group, self.broadcast_buffers)

    def _build_buckets(self, cap_bytes: int, shared: Optional[bool]) -> List[Bucket]:
        groups: List[tuple] = []
        current: Dict[np.dtype, list] = {}
        sizes: Dict[np.dtype, int] = {}
        for p in reversed(self._params):
            dt = p.array.dtype
            current.setdefault(dt, []).append(p)
            sizes[dt] = sizes.get(dt, 0) + p.array.nbytes
            if sizes[dt] >= cap_bytes:
                groups.append((current.pop(dt), dt))
                sizes[dt] = 0
        groups += [(params, dt) for dt, params in current.items()]
        self._specs = [(sum(p.array.size for p in params), dt) for params, dt in groups]
        hook = _FP16 if self.gradient_compression else None
        self._storage = bucket_storage(self._group, self._specs, shared, hook,
                                       self.gradient_as_bucket_view)
        return [Bucket(i, params, flat)
                for i, ((params, _), flat) in enumerate(zip(groups, self._storage.flats))]

    # -- communication hook -------------------------------------------------------------
    def register_comm_hook(self, state: Any, hook: Callable) -> None:
        """Average every bucket with ``hook(state, bucket) -> Future`` (PyTorch's semantics):
        ``bucket.buffer()`` holds this rank's local gradients, and the array the future gives
        (the average over the group, or an approximation of it) becomes the gradients. Every
        rank registers the same hook, once, before the first backward."""
        name = getattr(hook, "__qualname__", type(hook).__name__)
        if not callable(hook):
            raise TypeError(f"register_comm_hook: hook must be a callable hook(state, bucket) -> "
                            f"Future, got {hook!r}")
        if self._hook_name is not None:
            raise RuntimeError(f"register_comm_hook({name}): this DistributedDataParallel already "
                               f"has the communication hook {self._hook_name}; a hook can be "
                               "registered only once")
        if self._started:
            raise RuntimeError(f"register_comm_hook({name}) must be called before the first "
                               "backward() or sync_gradients(): gradients were already averaged "
                               "without it")
        object_collectives.check_same_everywhere(
            resolve_group(self._group), "ddp_comm_hook", [zlib.crc32(name.encode())],
            f"DistributedDataParallel.register_comm_hook({name})")
        if self._storage.shared:
            if self._shared_request:
                raise ValueError(f"register_comm_hook({name}): shared_buckets=True was asked "
                                 "for, but a hook runs its own collectives on private buckets; "
                                 "leave shared_buckets at None")
            self._use_storage(bucket_storage(self._group, self._specs, False, name,
                                             self.gradient_as_bucket_view))
        self._hook_name = name
        buckets = self._buckets  # not self: the storage must not keep the wrapper alive

        def run(index: int, flat: np.ndarray):
            b = buckets[index]
            return hook(state, GradBucket(index, flat, b.params, b.offsets,
                                          index == len(buckets) - 1))
        self._storage.use_comm_hook(run)

    def _use_storage(self, storage) -> None:
        self._storage = storage
        for bucket in self._buckets:
            bucket.flat = storage.flats[bucket.index]
        self.shared_buckets = storage.shared

    # -- forward / sync -------------------------------------------------------------------
    def forward(self, *args, **kwargs):
        if self._unsynced is not None:
            raise RuntimeError(self._forgotten("forward()"))
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Gradients accumulate locally inside; the first backward after it (explicit mode:
        the next ``sync_gradients()``) averages the accumulated sums."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def _grad_ready(self, param) -> None:
        backward = autograd.current_backward()
        if backward != self._backward:  # the first gradient of a new backward
            self._backward = backward
            self._started = True
            self._begin_backward()
        if not self._sync_enabled:
            return
        if not self._fresh:  # a name, not the Parameter: Module would register that as ours
            self._first_fresh = self._names.get(id(param), "?")
        self._fresh += 1
        if not self.auto_sync or self._world == 1:
            return
        self._bucket_of[id(param)].ready += 1
        # Launch in bucket order so every rank issues the same collectives in the same order.
        while (self._next_launch < len(self._buckets)
               and self._buckets[self._next_launch].ready == len(self._buckets[self._next_launch].params)):
            self._launch(self._buckets[self._next_launch])
            self._next_launch += 1

    def _begin_backward(self) -> None:
        if self._unsynced is not None:
            raise RuntimeError(self._forgotten("a second backward()"))
        self._averaged = False
        self._reset()  # also drops what a backward that failed halfway left behind
        if self._sync_enabled:
            self._fresh = 0
            autograd.queue_callback(self._end_of_backward)

    def _end_of_backward(self) -> None:
        """Queued by the first hook of a backward outside ``no_sync()``; runs after its last
        node. Buckets none of whose gradients arrived (unused parameters) are launched here,
        so every rank runs the same collectives."""
        if not self.auto_sync:
            if self._fresh:
                self._unsynced = (self._fresh, self._first_fresh)
            return
        self._average()
        self._averaged = True

    def _forgotten(self, what: str) -> str:
        count, first = self._unsynced
        return (f"DistributedDataParallel(auto_sync=False): {what} after a backward() whose "
                f"gradients ({count} parameters, the first {first!r}) were never averaged over the "
                f"{self._world} ranks, so the replicas would drift apart: call sync_gradients() "
                "after loss.backward(), run that backward inside no_sync() to accumulate, or "
                "leave auto_sync at its default (True) to average during backward()")

    def _launch(self, bucket: Bucket) -> None:
        if self.auto_sync and self._storage.copies_on_queue and bucket.on_host():
            # Launched by the hooks, its gradients are final: the queue's thread packs,
            # averages and unpacks it while backward goes on. On backward's thread the copies,
            # most of an shm all-reduce, would only move from after backward into it. (A
            # bucket with a gradient missing is not on_host: packed and unpacked here.)
            bucket.used[:] = True
            bucket.work = self._storage.all_reduce(bucket.index, bucket)
            bucket.unpacked = True
            return
        self._storage.acquire()  # shared buckets: peers no longer read the last sync's results
        bucket.pack()
        self._check_unused(bucket)
        bucket.work = self._storage.all_reduce(bucket.index)

    def _check_unused(self, bucket: Bucket) -> None:
        if self.find_unused_parameters or bucket.used.all():
            return
        names = [self._names.get(id(p), "?") for p, u in zip(bucket.params, bucket.used) if not u]
        raise RuntimeError(
            f"DistributedDataParallel: parameters received no gradient this step: {names}. "
            "Make every parameter take part in the loss, or pass find_unused_parameters=True")

    def sync_gradients(self) -> None:
        """Average every parameter's gradient over the group. After a backward that already
        averaged them (automatic mode) this does nothing; inside ``no_sync()`` neither."""
        if not self._sync_enabled or self._averaged:
            return
        self._average()
        self._unsynced = None

    def _average(self) -> None:
        """Launch the buckets not launched yet, wait for all, unpack the averages."""
        self._started = True
        if self._world == 1:
            self._reset()
            return
        arrived = time.perf_counter()
        try:
            for bucket in self._buckets:
                if bucket.work is None:
                    self._launch(bucket)
            for bucket in self._buckets:
                bucket.work.wait()
            used = self._globally_used() if self.find_unused_parameters else None
            start = 0
            for bucket in self._buckets:
                n = len(bucket.params)
                # a bucket unpacked on the queue had every gradient here: all of them are kept
                if not bucket.unpacked:
                    keep = None if used is None else used[start:start + n]
                    self._storage.unpack(bucket.index, bucket.params, bucket.offsets, keep)
                start += n
            self._storage.release()
            self._sync_times.record(arrived, [b.work for b in self._buckets])
        finally:
            self._reset()

    def comm_stats(self) -> Dict[str, float]:
        """Seconds of gradient communication over all syncs so far: ``waited_s`` (what the
        thread that ran backward spent in syncs: after backward with overlap, the whole
        ``sync_gradients()`` without), ``hidden_s`` (what the communication thread spent on
        the buckets while backward still computed) and ``syncs``. See ``bucket``."""
        return self._sync_times.as_dict()

    def _globally_used(self) -> np.ndarray:
        """Which parameters got a gradient on at least one rank (PyTorch leaves the rest None)."""
        used = np.concatenate([b.used for b in self._buckets]).astype(np.int32)
        collectives.all_reduce(used, ReduceOp.MAX, group=self._group)
        return used.astype(bool)

    def _reset(self) -> None:
        self._next_launch = 0
        for bucket in self._buckets:
            bucket.ready = 0
            bucket.work = None
            bucket.unpacked = False

    def __repr__(self) -> str:
        return (f"DistributedDataParallel(world_size={self._world}, buckets={len(self._buckets)}, "
                f"auto_sync={self.auto_sync}, shared_buckets={self.shared_buckets})\n"
                f"  module: {self.module!r}")
