"""What a registered communication hook does with each of DDP's buckets: a plan per bucket.

By default a bucket holds its parameters' dtype, and the hook gets it as a ``GradBucket``
(``comm_hooks.bucket``) once DDP packed it. A hook whose result is the average of a copy of
the bucket in a narrower dtype (``comm_hooks.default_hooks.packed_form``: the float16 of
``fp16_compress_hook``) changes the plan of every bucket it would narrow: DDP packs that
bucket straight into the narrower dtype and widens the average while unpacking (``wire``),
and the hook's packed form, which only averages, runs on it. The buckets are launched, waited
for and unpacked by the same code either way.

Shared buckets (``shared_buckets``) average without any hook: ``on_shared_buckets`` tells
which hooks they can stand in for, bit for bit: ``allreduce_hook`` and ``fp16_compress_hook``
over DDP's own group (the latter on shared buckets that hold the float16 copies, packed and
unpacked as private ones would be, and summed as the shared-memory all-reduce sums float16),
and a hook that wraps ``allreduce_hook`` and names what to run once the averages are in place
(``after_shared_average``: ZeRO's step, ``comm_hooks.ddp_zero_hook``). A ``CommHookState``
still counts the steps and bytes. Any other hook runs its own collectives, on private buckets.
"""
from __future__ import annotations

from typing import Any, Callable, List, NamedTuple, Optional, Sequence

import numpy as np

from ..comm_hooks.bucket import GradBucket
from ..comm_hooks.default_hooks import CommHookState, allreduce_hook, packed_form
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


class SharedStandIn(NamedTuple):
    """How shared buckets stand in for a hook: ``wire``, the dtype a bucket of wider floats
    holds (None: the parameters' own), and ``after``, what runs once the averages are in place
    and unpacked."""
    wire: Optional[np.dtype]
    after: AfterSharedAverage


def _after_nothing(arena: Any, params_per_bucket: List[list]) -> None:
    """``allreduce_hook``: the averages are all it asks for."""


def _counting(state: CommHookState) -> AfterSharedAverage:
    """Count a sync of the shared buckets on ``state`` as the hook would have: each bucket's
    bytes as it travels (its float16 copy under ``fp16_compress_hook``), one step."""
    def after(arena: Any, params_per_bucket: List[list]) -> None:
        for flat in arena.flats:
            state.record(flat.nbytes)
        state.finish_step()
    return after


def on_shared_buckets(hook: Callable, state: Any, group: Any) -> Optional[SharedStandIn]:
    """How DDP's shared buckets stand in for ``hook`` (registered with ``state`` on a DDP over
    ``group``); None where the hook needs private buckets. A hook built around another names
    it ``averaging_hook`` and what it does after the average ``after_shared_average``; such a
    hook may write into the segment after the average (ZeRO's updated parameters), so it gets
    buckets of the parameters' dtype and a group as its state."""
    packed = packed_form(hook)
    wire, averaging = packed if packed is not None else (None, hook)
    if getattr(hook, "averaging_hook", None) is not None:
        wire, averaging = None, hook.averaging_hook
    if averaging is not allreduce_hook:
        return None
    after = getattr(hook, "after_shared_average", _after_nothing)
    if type(state) is CommHookState and after is _after_nothing:
        after, state = _counting(state), state.process_group
    elif state is not None and not isinstance(state, ProcessGroup):
        return None  # a state of another kind may watch the hook's collectives
    if resolve_group(state).group_id != resolve_group(group).group_id:
        return None
    return SharedStandIn(wire, after)
