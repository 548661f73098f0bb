"""What a registered communication hook does with each of DDP's buckets: a plan per bucket.

By default a bucket holds its parameters' dtype, and the hook gets it as a ``GradBucket``
(``comm_hooks.bucket``) once DDP packed it. A hook whose result is the average of a copy of
the bucket in a narrower dtype (``comm_hooks.default_hooks.packed_form``: the float16 of
``fp16_compress_hook``) changes the plan of every bucket it would narrow: DDP packs that
bucket straight into the narrower dtype and widens the average while unpacking (``wire``),
and the hook's packed form, which only averages, runs on it. The buckets are launched, waited
for and unpacked by the same code either way.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from ..comm_hooks.bucket import GradBucket
from ..comm_hooks.default_hooks import packed_form
from .bucket import Bucket
from .wire import narrower_wire


class HookPlan:
    """Runs the hook on bucket ``index`` (``plan(index, flat)``, what ``use_comm_hook`` of
    the bucket storage calls); ``wires[index]`` is the dtype the bucket travels in, or None
    for its parameters' own.

    It holds the buckets, not the DDP wrapper: the storage must not keep the wrapper alive.
    ``grads_as_views`` (gradients that are views of their bucket) keeps every bucket in its
    parameters' dtype."""

    def __init__(self, state: Any, hook: Callable, buckets: Sequence[Bucket],
                 grads_as_views: bool = False) -> None:
        wire, on_wire = packed_form(hook) or (None, None)
        self.wires: List[Optional[np.dtype]] = [
            None if grads_as_views else narrower_wire(b.dtype, wire) for b in buckets]
        self._hooks = [hook if w is None else on_wire for w in self.wires]
        self._state, self._buckets = state, list(buckets)

    def __call__(self, index: int, flat: np.ndarray) -> Any:
        b = self._buckets[index]
        last = index == len(self._buckets) - 1
        return self._hooks[index](self._state, GradBucket(index, flat, b.params, b.offsets, last))
