"""The plain hooks: ``allreduce_hook`` (the average) and ``fp16_compress_hook``; and
``CommHookState``, the state that counts what a hook sends.

As in PyTorch, the state of these two hooks is the process group to average over (None: the
default group). A ``CommHookState`` may be passed instead: then it also counts the steps and
the bytes this rank handed to collectives, as the compressing hooks' states do. Bytes are the
payload a rank contributes (the array it all-reduces, or its part of an all-gather), whatever
the algorithm makes of it on the wire (a ring all-reduce sends about twice that).
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from ...backends.numba_kernels import cast_to_float16
from .. import collectives
from ..group.process_group import ProcessGroup
from ..group.world import resolve_group
from ..reduce_ops import ReduceOp
from ..work import Future
from .bucket import GradBucket


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


def average_future(pg: ProcessGroup, tensor: np.ndarray) -> Future:
    """Start averaging ``tensor`` in place over ``pg``; a future of ``tensor``."""
    work = collectives.all_reduce(tensor, ReduceOp.AVERAGE, group=pg, async_op=True)
    return Future.after(work, tensor)


def allreduce_hook(state: Any, bucket: GradBucket) -> Future:
    """The average over the group: what DDP does without a hook, bit for bit."""
    flat = bucket.buffer()
    _account(state, bucket, flat.nbytes)
    return average_future(hook_group(state), flat)


def fp16_compress_hook(state: Any, bucket: GradBucket) -> Future:
    """Average a float16 copy (half the bytes of float32), written back in the bucket's dtype.

    The average is taken in float16: values round to float16 (about 3 significant digits),
    and a sum beyond float16's range (65504) becomes inf, as it would in the float16 copy.
    """
    flat = bucket.buffer()
    if flat.dtype == np.float16:
        return allreduce_hook(state, bucket)
    if flat.dtype == np.float32:
        wire = cast_to_float16(flat)  # Numba: several times NumPy's cast
    else:
        with np.errstate(over="ignore"):
            wire = flat.astype(np.float16)
    _account(state, bucket, wire.nbytes)
    sent = average_future(hook_group(state), wire)

    def decompress(future: Future) -> np.ndarray:
        np.copyto(flat, future.value())
        return flat
    return sent.then(decompress)
