"""How DDP synchronises one step's buckets: ``StepSync``, the part of
``DistributedDataParallel`` that launches, waits for and unpacks them.

Hooks on the parameters see each gradient arrive. In automatic mode a bucket is launched as
soon as all of its gradients are in, in bucket order, so that every rank issues the same
collectives in the same order; a callback queued for the end of backward launches what is
left (buckets of unused parameters), waits for every bucket and unpacks the averages. In
explicit mode (``auto_sync=False``) ``sync_gradients()`` does that, and the hooks only note
gradients that were never synchronised, so that a forward or a second backward after them
raises instead of letting the replicas drift apart.

The storage (``buckets``) does the averaging and the copies out; ``DistributedDataParallel``
holds the buckets, the storage and the settings this class reads.
"""
from __future__ import annotations

import time
import weakref

import numpy as np

from ...core import autograd
from .. import collectives
from ..reduce_ops import ReduceOp
from .bucket import Bucket, SyncTimes


def _weak_hook(ddp: "StepSync"):
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


class StepSync:
    """The sync of a step's buckets, mixed into ``DistributedDataParallel`` (see the module
    docstring); ``_start_watching_backward()`` starts it once the buckets exist."""

    def _start_watching_backward(self) -> None:
        """The state of a step's sync, and the hooks that see each gradient arrive (also in
        explicit mode: there they only watch for a forgotten ``sync_gradients()``)."""
        self._bucket_of = {id(p): b for b in self._buckets for p in b.params}
        self._bucket_params = [b.params for b in self._buckets]
        self._next_launch = 0
        self._backward = None   # the backward the hooks last saw (autograd.current_backward)
        self._averaged = False  # the last backward's callback averaged the gradients
        self._unsynced = None   # explicit mode: (count, first name) of gradients never synced
        self._fresh = 0         # gradients this backward produced outside no_sync()
        self._first_fresh = "?"
        self._sync_times = SyncTimes()
        self._hook_handles = [p.register_post_accumulate_grad_hook(_weak_hook(self))
                              for p in self._params]
        weakref.finalize(self, _remove_all, list(self._hook_handles))

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
        if not self.auto_sync or self._alone():
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

    def _launch(self, bucket: Bucket, here: bool = False) -> None:
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
        if here and not self._storage.shared:
            bucket.work = self._storage.all_reduce(bucket.index, here=True)
        else:
            bucket.work = self._storage.all_reduce(bucket.index)

    def _check_unused(self, bucket: Bucket) -> None:
        if self.find_unused_parameters or bucket.used.all():
            return
        names = [self._names.get(id(p), "?") for p, u in zip(bucket.params, bucket.used) if not u]
        raise RuntimeError(
            f"DistributedDataParallel: parameters received no gradient this step: {names}. "
            "Make every parameter take part in the loss, or pass find_unused_parameters=True")

    def _average(self) -> None:
        """Launch the buckets not launched yet, wait for all, unpack the averages."""
        self._started = True
        if self._alone():
            self._reset()
            return
        arrived = time.perf_counter()
        try:
            # The last bucket averages on this thread (private buckets): the thread would
            # only wait for the queue's, and each switch between them is a scheduler wake-up.
            for bucket in self._buckets:
                if bucket.work is None:
                    self._launch(bucket, here=bucket is self._buckets[-1])
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
            if self._after_shared_average is not None:  # before peers may write the segment
                self._after_shared_average(self._storage, self._bucket_params)
            self._storage.release()
            self._sync_times.record(arrived, [b.work for b in self._buckets])
        finally:
            self._reset()

    def _alone(self) -> bool:
        """One rank and no communication hook: the gradients are their own average. A hook
        still runs on one rank, as PyTorch's DDP runs it (PowerSGD or fp16 change the
        gradients there too, and a script must behave the same at every world size)."""
        return self._world == 1 and self._hook_name is None

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
