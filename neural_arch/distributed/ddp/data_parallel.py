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
Both are ``step_sync``'s, mixed into the class here.

Bucket storage comes from ``buckets.bucket_storage``, private or shared behind one interface:
on the whole world of an ``shm`` transport the buckets live in shared memory
(``shared_buckets``), so gradients are packed straight into the segment the averaging reads
and nothing is copied in or out of a workspace.

``register_comm_hook(state, hook)`` (PyTorch's) replaces the average of each bucket by
``hook(state, bucket)``, which may compress (``distributed.comm_hooks``: float16, PowerSGD,
top-k). The hook plugs into the storage's ``all_reduce``/``unpack``, so the buckets are packed,
launched during backward and unpacked exactly as without one; only private buckets can host
a hook that runs collectives of its own, so shared ones are given up for it. Shared buckets
stand in for ``allreduce_hook`` and ``fp16_compress_hook`` (their average is the hook's, bit
for bit) and for the ZeRO hooks around ``allreduce_hook``, whose updated parameters pass
through the shared segment (``hook_plan``). ``gradient_compression=True`` registers
``fp16_compress_hook``; under it a float32 bucket is packed straight into float16 and
unpacked from it (``hook_plan``, ``wire``), private or shared, with the hook's bits and no
casting passes of its own.

``naive.py`` holds the idea in its simplest form (one all-reduce per parameter).
"""
from __future__ import annotations

import contextlib
import zlib
from typing import Any, Callable, Dict, List, Optional

import numpy as np

from ...nn import Module
from ..collectives import objects as object_collectives
from ..comm_hooks.default_hooks import fp16_compress_hook
from ..group.world import get_world_size, is_initialized, resolve_group
from ..replicas import broadcast_module_state, check_replicas_agree
from .bucket import Bucket
from .buckets import bucket_storage, group_parameters
from .hook_plan import HookPlan, on_shared_buckets
from .step_sync import StepSync
from .wire import narrower_wire


class DistributedDataParallel(StepSync, Module):
    """Data-parallel wrapper; see the module docstring. ``.module`` is the wrapped model.

    ``shared_buckets``: None (default) keeps the buckets in shared memory whenever the group
    is the whole world of an ``shm`` transport and no communication hook but ``allreduce_hook``,
    ``fp16_compress_hook`` (their buckets then hold float16) or a ZeRO hook around
    ``allreduce_hook`` is registered; True
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
        # shared buckets standing in for a hook: what runs once the averages are in place
        self._after_shared_average: Optional[Callable] = None
        self._names: Dict[int, str] = {id(p): n for n, p in module.named_parameters()}
        self._params = [p for _, p in module.named_parameters() if p.requires_grad]
        self._check_replicas_agree()
        self._broadcast_state()
        self._shared_request = shared_buckets
        self._buckets = self._build_buckets(int(bucket_size_mb * 2 ** 20), shared_buckets)
        self.shared_buckets = self._storage.shared  # averaged in one shared segment
        if gradient_compression:
            self.register_comm_hook(group, fp16_compress_hook)
        self._start_watching_backward()

    # -- construction ---------------------------------------------------------------------
    def _check_replicas_agree(self) -> None:
        check_replicas_agree(self.module, self._group, "DistributedDataParallel")

    def _broadcast_state(self) -> None:
        broadcast_module_state(self.module, self._group, self.broadcast_buffers)

    def _build_buckets(self, cap_bytes: int, shared: Optional[bool]) -> List[Bucket]:
        groups = group_parameters(self._params, cap_bytes)
        self._specs = [(sum(p.array.size for p in params), dt) for params, dt in groups]
        # shared buckets are made in float16 at once for the hook registered next
        wires = self._wires(np.float16) if self.gradient_compression else None
        self._storage = bucket_storage(self._group, self._specs, shared, None,
                                       self.gradient_as_bucket_view, wires)
        return [Bucket(i, params, flat)
                for i, ((params, _), flat) in enumerate(zip(groups, self._storage.flats))]

    @property
    def process_group(self) -> Any:
        """The group gradients are averaged over (None: the default group), as torch's."""
        return self._group

    def bucket_parameters(self) -> List[List[Any]]:
        """The parameters of each bucket, in bucket order (fixed at construction)."""
        return [list(bucket.params) for bucket in self._buckets]

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
        stand_in = on_shared_buckets(hook, state, self._group) if self._storage.shared else None
        if stand_in is not None:
            wires = self._wires(stand_in.wire)
            if wires != self._storage.wires:  # (an unavailable segment: private buckets then)
                self._use_storage(bucket_storage(self._group, self._specs, self._shared_request,
                                                 None, False, wires))
        if stand_in is not None and self._storage.shared:  # the hook's average, bit for bit
            self._hook_name = name
            self._after_shared_average = stand_in.after
            return
        if self._storage.shared:
            if self._shared_request:
                raise ValueError(f"register_comm_hook({name}): shared_buckets=True was asked "
                                 "for, but this hook runs its own collectives on private "
                                 "buckets (shared ones serve allreduce_hook, "
                                 "fp16_compress_hook and the ZeRO hooks around allreduce_hook, "
                                 "with a process group or a CommHookState as the state); leave "
                                 "shared_buckets at None")
            self._use_storage(bucket_storage(self._group, self._specs, False, name,
                                             self.gradient_as_bucket_view))
        elif self._world == 1:  # the hook runs on one rank too: buckets with room for it
            self._use_storage(bucket_storage(self._group, self._specs, False, name,
                                             self.gradient_as_bucket_view))
        self._hook_name = name
        plan = HookPlan(state, hook, self._buckets, self.gradient_as_bucket_view)
        self._storage.use_comm_hook(plan, plan.wires)
        self._use_storage(self._storage)  # the buckets' flats may be float16 copies now

    def _wires(self, wire) -> list:
        """The dtype each bucket travels in under a hook averaging ``wire`` copies."""
        return [narrower_wire(dt, wire) for _, dt in self._specs]

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

    def sync_gradients(self) -> None:
        """Average every parameter's gradient over the group. After a backward that already
        averaged them (automatic mode) this does nothing; inside ``no_sync()`` neither."""
        if not self._sync_enabled or self._averaged:
            return
        self._average()
        self._unsynced = None

    def comm_stats(self) -> Dict[str, float]:
        """Seconds of gradient communication over all syncs so far: ``waited_s`` (what the
        thread that ran backward spent in syncs: after backward with overlap, the whole
        ``sync_gradients()`` without), ``hidden_s`` (what the communication thread spent on
        the buckets while backward still computed) and ``syncs``. See ``bucket``."""
        return self._sync_times.as_dict()

    def __repr__(self) -> str:
        return (f"DistributedDataParallel(world_size={self._world}, buckets={len(self._buckets)}, "
                f"auto_sync={self.auto_sync}, shared_buckets={self.shared_buckets})\n"
                f"  module: {self.module!r}")
