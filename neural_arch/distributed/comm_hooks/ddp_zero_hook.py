"""DDP communication hooks that run ``ZeroRedundancyOptimizer``'s step inside backward
(PyTorch's ``torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook``; that path imports
this module too).

    zero = ZeroRedundancyOptimizer(ddp.parameters(), Adam, overlap_with_ddp=True, lr=1e-3)
    ddp.register_comm_hook(None, hook_with_zero_step(allreduce_hook, ddp, zero))
    for x, y in batches:
        zero.zero_grad()
        loss_fn(ddp(x), y).backward()  # the owners update, the updates are broadcast
        zero.step()                    # nothing left to do; checks that the hook did it

Each wraps a hook (``allreduce_hook``, ``fp16_compress_hook``, ...) that still averages every
bucket. ``hook_with_zero_step`` starts stepping when the last bucket was launched (the end of
backward's computation): for every bucket in order it waits for the average, the owner
updates those parameters and broadcasts them, overlapping the averages and broadcasts still
in flight. ``hook_with_zero_step_interleaved`` steps bucket ``k - 1`` as soon as bucket ``k``
was launched, so the steps also overlap the rest of backward's computation (each waits for
its bucket's average first). Both leave every replica updated when backward returns, bit for
bit as DDP followed by the plain optimizer. Buckets go whole to rank ``index % world_size``;
``shard_buckets=True`` splits them over ranks to even the shares (torch's rule:
``optim.bucket_assignment``). The step itself: ``optim.overlap_step``.

Wrapping ``allreduce_hook`` on DDP's shared buckets (the whole world of an ``shm`` transport),
neither hook runs: DDP averages the buckets in shared memory as without a hook, and then the
owners update and hand their new values to the others through that memory, without a
broadcast (``OverlapStep.step_on_shared``); each hook names that step
``after_shared_average`` and the hook it wraps ``averaging_hook`` (``ddp.hook_plan``).
"""
from __future__ import annotations

from typing import Any, Callable

from ..work import Future
from .bucket import GradBucket

Hook = Callable[[Any, GradBucket], Future]


def _attach(builder: str, hook: Hook, ddp: Any, zero: Any, shard_buckets: bool):
    """Check the arguments as torch does and let ``zero`` deal out ``ddp``'s buckets."""
    from ..ddp.data_parallel import DistributedDataParallel
    from ..group.world import resolve_group
    from ..optim.zero_redundancy import ZeroRedundancyOptimizer
    if not callable(hook):
        raise TypeError(f"{builder}: hook must be a communication hook hook(state, bucket) -> "
                        f"Future (allreduce_hook, ...), got {hook!r}")
    if not isinstance(zero, ZeroRedundancyOptimizer):
        raise TypeError(f"{builder}: zero must be a ZeroRedundancyOptimizer built with "
                        f"overlap_with_ddp=True, got a {type(zero).__name__}")
    if not zero.overlap_with_ddp:
        raise ValueError(f"{builder}: the ZeroRedundancyOptimizer must be constructed with "
                         f"overlap_with_ddp=True to step inside DDP's hook (it has "
                         f"overlap_with_ddp=False and steps after backward)")
    if not isinstance(ddp, DistributedDataParallel):
        raise TypeError(f"{builder}: ddp must be the DistributedDataParallel the hook will be "
                        f"registered on, got a {type(ddp).__name__}")
    # DDP fixes its buckets at construction (never rebuilt), so they can be dealt out now
    params_per_bucket = ddp.bucket_parameters()
    names = {id(p): name for name, p in ddp.module.named_parameters()}
    return zero.attach_to_ddp(params_per_bucket, resolve_group(ddp.process_group).ranks,
                               shard_buckets, names)


def hook_with_zero_step(hook: Hook, ddp: Any, zero: Any,
                        shard_buckets: bool = False) -> Hook:
    """``hook``, followed on the last bucket by ``zero``'s step of every bucket in order and
    the broadcasts of the updates (see the module docstring). ``zero`` must have been built
    with ``overlap_with_ddp=True`` over ``ddp.parameters()`` (ValueError otherwise; TypeError
    for another optimizer); register the result on ``ddp`` before the first backward."""
    overlap = _attach("hook_with_zero_step", hook, ddp, zero, shard_buckets)

    def hook_with_zero_fn(state: Any, bucket: GradBucket) -> Future:
        future = hook(state, bucket)
        overlap.record(bucket, future)
        if bucket.index() == overlap.num_buckets - 1:
            overlap.step_through(bucket.index())
        return future
    return _on_shared_buckets(hook_with_zero_fn, hook, overlap)


def hook_with_zero_step_interleaved(hook: Hook, ddp: Any, zero: Any,
                                    shard_buckets: bool = False) -> Hook:
    """``hook``, then ``zero``'s step of the previous bucket (of this one too on the last):
    the steps interleave with backward's computation (see the module docstring). The same
    arguments and checks as ``hook_with_zero_step``."""
    overlap = _attach("hook_with_zero_step_interleaved", hook, ddp, zero, shard_buckets)

    def hook_with_zero_interleaved_fn(state: Any, bucket: GradBucket) -> Future:
        future = hook(state, bucket)
        overlap.record(bucket, future)
        index = bucket.index()
        overlap.step_through(index if index == overlap.num_buckets - 1 else index - 1)
        return future
    return _on_shared_buckets(hook_with_zero_interleaved_fn, hook, overlap)


def _on_shared_buckets(zero_hook: Hook, hook: Hook, overlap: Any) -> Hook:
    """What DDP's shared buckets need to stand in for ``zero_hook`` (see the module
    docstring)."""
    zero_hook.averaging_hook = hook
    zero_hook.after_shared_average = overlap.step_on_shared
    return zero_hook


__all__ = ["hook_with_zero_step", "hook_with_zero_step_interleaved"]
