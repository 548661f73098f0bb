"""What a registered communication hook does with each of DDP's buckets: a plan per bucket.

By default a bucket holds its parameters' dtype, and the hook gets it as a ``GradBucket``
(``comm_hooks.bucket``) once DDP packed it. A hook whose result is the average of a copy of
the bucket in a narrower dtype (``comm_hooks.default_hooks.packed_form``: the float16 of
``fp16_compress_hook``) changes the plan of every bucket it would narrow: DDP packs that
bucket straight into the narrower dtype and widens the average while unpacking (``wire``),
and the hook's packed form, which only averages, runs on it. The buckets are launched, waited
for and unpacked by the same code either way.

Shared buckets (``shared_buckets``) average without any hook: ``on_shared_buckets`` tells
which hooks they can stand in for, bit for bit: ``allreduce_hook`` over DDP's own group, and
a hook that wraps it and names what to run once the averages are in place
(``after_shared_average``: ZeRO's step, ``comm_hooks.ddp_zero_hook``). Any other hook runs its
own collectives, on private buckets.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np

from ..comm_hooks.bucket import GradBucket
from ..comm_hooks.default_hooks import allreduce_hook, packed_form
from ..group.process_group import ProcessGroup
from ..group.world import resolve_group
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


# what runs after the shared buckets' averages: (arena, parameters of each bucket) -> None
AfterSharedAverage = Callable[[Any, List[list]], None]


def _after_nothing(arena: Any, params_per_bucket: List[list]) -> None:
    """``allreduce_hook``: the averages are all it asks for."""


def on_shared_buckets(hook: Callable, state: Any, group: Any) -> Optional[AfterSharedAverage]:
    """What DDP runs once its shared buckets are averaged and unpacked, in place of ``hook``
    (registered with ``state`` on a DDP over ``group``); None where the hook needs private
    buckets. A hook built around another names it ``averaging_hook`` and what it does after
    the average ``after_shared_average``."""
    averaging = getattr(hook, "averaging_hook", hook)
    if averaging is not allreduce_hook:
        return None
    if state is not None and not isinstance(state, ProcessGroup):
        return None  # a state that counts what the hook sends (CommHookState) sees collectives
    if resolve_group(state).group_id != resolve_group(group).group_id:
        return None
    return getattr(hook, "after_shared_average", _after_nothing)
