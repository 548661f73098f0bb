"""The plain hooks: ``allreduce_hook`` (the average) and ``fp16_compress_hook``; and
``CommHookState``, the state that counts what a hook sends.

As in PyTorch, the state of these two hooks is the process group to average over (None: the
default group). A ``CommHookState`` may be passed instead: then it also counts the steps and
the bytes this rank handed to collectives, as the compressing hooks' states do. Bytes are the
payload a rank contributes (the array it all-reduces, or its part of an all-gather), whatever
the algorithm makes of it on the wire (a ring all-reduce sends about twice that).

``averaging_here()`` makes these hooks average at once on the calling thread instead of
queueing the all-reduce: DDP uses it for the last bucket of a sync, after which its thread
would only wait for the queue's (two thread switches, each a scheduler wake-up, for nothing).
"""
from __future__ import annotations

import contextlib
import threading
from typing import Any, Callable, Iterator, Optional, Tuple

import numpy as np

from .. import collectives
from ..group.process_group import ProcessGroup
from ..group.world import resolve_group
from ..reduce_ops import ReduceOp
from ..reductions.kernels import to_float16, to_float32
from ..work import Future
from .bucket import GradBucket


MAX_KEPT_WIRES = 64  # float16 copies a CommHookState keeps for fp16_compress_hook
_here = threading.local()  # ``on``: averaging_here() is active on this thread


class CommHookState:
    """The process group of a hook, its step count and the bytes it sent.

    ``iter``: steps whose buckets all went through the hook (counted on the last bucket, so
    every bucket of a step sees the same value). ``bytes_sent``: all steps; ``last_step_bytes``:
    the last finished step.
    """

    def __init__(self, process_group: Optional[ProcessGroup] = None) -> None:
        self.process_group = process_group
        self.iter = 0
        self.bytes_sent = 0
        self.last_step_bytes = 0
        self._step_bytes = 0

    def record(self, nbytes: int) -> None:
        self.bytes_sent += int(nbytes)
        self._step_bytes += int(nbytes)

    def maybe_increase_iter(self, bucket: GradBucket) -> None:
        if bucket.is_last():
            self.finish_step()

    def finish_step(self) -> None:
        """Every bucket of a step went through the hook (or through shared buckets standing
        in for it)."""
        self.iter += 1
        self.last_step_bytes, self._step_bytes = self._step_bytes, 0


def hook_group(state: Any) -> ProcessGroup:
    """The group a hook averages over: ``state`` itself (a group or None) or its
    ``process_group``."""
    group = state if state is None or isinstance(state, ProcessGroup) else getattr(
        state, "process_group", None)
    return resolve_group(group)


def _account(state: Any, bucket: GradBucket, nbytes: int) -> None:
    if isinstance(state, CommHookState):
        state.record(nbytes)
        state.maybe_increase_iter(bucket)


@contextlib.contextmanager
def averaging_here() -> Iterator[None]:
    """Inside, ``average_future`` (so ``allreduce_hook`` and ``fp16_compress_hook``) averages
    synchronously on this thread, after the queued collectives, in the same order."""
    previous = getattr(_here, "on", False)
    _here.on = True
    try:
        yield
    finally:
        _here.on = previous


def average_future(pg: ProcessGroup, tensor: np.ndarray) -> Future:
    """Start averaging ``tensor`` in place over ``pg`` (or average it now, inside
    ``averaging_here()``); a future of ``tensor``."""
    if getattr(_here, "on", False):
        collectives.all_reduce(tensor, ReduceOp.AVERAGE, group=pg)
        return Future.completed(tensor)
    work = collectives.all_reduce(tensor, ReduceOp.AVERAGE, group=pg, async_op=True)
    return Future.after(work, tensor)


def allreduce_hook(state: Any, bucket: GradBucket) -> Future:
    """The average over the group: what DDP does without a hook, bit for bit."""
    flat = bucket.buffer()
    _account(state, bucket, flat.nbytes)
    return average_future(hook_group(state), flat)


def _wire_buffer(state: Any, bucket: GradBucket, flat: np.ndarray) -> np.ndarray:
    """Storage for the float16 copy of ``flat``: kept on a ``CommHookState`` per bucket
    buffer (DDP waits for every bucket's future before the next step runs the hook on that
    bucket again), so its pages are not faulted in afresh every step (a new 8 MiB array cost
    about as much as the cast itself); new for any other state."""
    if not isinstance(state, CommHookState):
        return np.empty(flat.shape, np.float16)
    kept = state.__dict__.setdefault("_fp16_wire", {})
    key = (id(flat), bucket.index(), flat.shape)  # two live buffers never share an id
    wire = kept.get(key)
    if wire is None:
        if len(kept) >= MAX_KEPT_WIRES:  # buckets rebuilt many times: start afresh
            kept.clear()
        wire = kept[key] = np.empty(flat.shape, np.float16)
    return wire


def fp16_compress_hook(state: Any, bucket: GradBucket) -> Future:
    """Average a float16 copy (half the bytes of float32), written back in the bucket's dtype.

    Values round to float16 (about 3 significant digits). The collectives add float16 in
    float32 (``reductions.kernels``): shared memory sums all ranks there and rounds the mean
    once; the ring and recursive doubling round each partial sum to float16, so a partial sum
    beyond float16's range (65504) becomes inf there. The casts and sums are compiled (Numba):
    NumPy converts and adds float16 one element at a time.

    DDP runs this hook on a float32 or float64 bucket without its casts: it packs such a
    bucket straight into float16 and unpacks from it (``packed_form``), with the same bits.
    """
    flat = bucket.buffer()
    if flat.dtype == np.float16:
        return allreduce_hook(state, bucket)
    # float32 through the compiled cast; other dtypes through NumPy's
    wire = to_float16(flat, _wire_buffer(state, bucket, flat))
    _account(state, bucket, wire.nbytes)
    sent = average_future(hook_group(state), wire)

    def decompress(future: Future) -> np.ndarray:
        if flat.dtype == np.float32:
            to_float32(future.value(), flat)
        else:
            np.copyto(flat, future.value())
        return flat
    return sent.then(decompress)


# hook -> (the dtype of the copy it averages, the hook that averages a bucket already in it)
_PACKED_FORMS = {fp16_compress_hook: (np.dtype(np.float16), allreduce_hook)}


def packed_form(hook: Any) -> Optional[Tuple[np.dtype, Callable[[Any, GradBucket], Future]]]:
    """For a hook whose result is the average of a copy of the bucket in a narrower dtype
    (``fp16_compress_hook``): that dtype, and the hook to run on a bucket that holds the copy
    already. DDP then packs the gradients straight into that dtype and widens the average
    while unpacking it, instead of two casts over a bucket of its own. None for other hooks."""
    try:
        return _PACKED_FORMS.get(hook)
    except TypeError:  # an unhashable callable
        return None
