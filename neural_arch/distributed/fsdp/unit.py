"""One unit: its shard, the gathering of its full parameters, and the averaging of its
gradients into the shard.

Every collective of a unit goes through here, so ``schedule.py`` only decides when. Gathers
may run in the background (``start_gather(async_op=True)``, waited for by ``wait_gather``);
gradient averaging always does (``launch_reduce``, completed by ``finish_reduce``).
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from ...nn import Module, Parameter
from .. import collectives
from ..group.world import get_rank, get_world_size
from ..reduce_ops import ReduceOp
from .flat_param import FlatLayout, GatherBuffer, GatherStats
from .options import MixedPrecision, ShardingStrategy


def _master_dtype(name: str, named_params: Sequence[Tuple[str, Any]]) -> np.dtype:
    dtypes = {str(p.array.dtype) for _, p in named_params}
    if len(dtypes) != 1:
        found = [(fqn, str(p.array.dtype)) for fqn, p in named_params]
        raise ValueError(f"FullyShardedDataParallel: unit {name or '<root>'!r} mixes parameter "
                         f"dtypes {sorted(dtypes)} ({found}); a unit's parameters are flattened "
                         "into one vector, so give them one dtype or wrap them in separate units")
    return np.dtype(dtypes.pop())


class Unit:
    """The parameters of one module (the root, or one the wrapping policy chose), sharded.

    ``shard`` is the Parameter the optimizer steps: this rank's ``layout.shard_numel`` elements
    of the flat vector in the parameters' own dtype. The module's parameters keep their
    identity; their ``.array`` are views of ``buffer`` (compute dtype), valid while gathered.
    """

    def __init__(self, name: str, module: Module, named_params: Sequence[Tuple[str, Any]],
                 group: Any, strategy: ShardingStrategy, mixed: Optional[MixedPrecision],
                 stats: GatherStats) -> None:
        self.name, self.module, self.group, self.stats = name, module, group, stats
        self.world = get_world_size(group)
        self.layout = FlatLayout(named_params, self.world if strategy.shards_parameters else 1)
        self.params: List[Any] = self.layout.params
        self.master_dtype = _master_dtype(name, named_params)
        self.compute_dtype = mixed.compute_dtype(self.master_dtype) if mixed else self.master_dtype
        self.reduce_dtype = mixed.reduction_dtype(self.master_dtype) if mixed else self.master_dtype
        self.shard_index = get_rank(group) if strategy.shards_parameters else 0
        self.lo, self.hi = self.layout.shard_range(self.shard_index)
        full = self.layout.flatten([p.array for p in self.params], self.master_dtype)
        self.buffer = GatherBuffer(self.layout.padded_numel, self.compute_dtype)
        label = f"{name}.flat_param" if name else "flat_param"
        if self.compute_dtype == self.master_dtype and not strategy.frees_parameters:
            # Never freed and in its own dtype: the shard is this rank's slice of the buffer
            # (unsharded: all of it), so the full parameters are the model's one copy, as the
            # ZeRO-2 formula counts them (optimizers update it in place; a rebound .array is
            # copied on gather).
            self.buffer.array[...] = full
            self.shard = Parameter(self.buffer.array[self.lo:self.hi], name=label)
        else:
            self.shard = Parameter(full[self.lo:self.hi].copy(), name=label)
        del full
        for param, view in zip(self.params, self.layout.views(self.buffer.array)):
            param.array = view
        self.gathered = False
        self.generation = -1  # the shards' generation the buffer holds
        self._pending: Optional[tuple] = None  # (Work, the array it sends)
        # per backward
        self.ready = 0
        self.completed = False
        self.pre_backward_done = False
        self._reduce: Optional[tuple] = None  # (Work or None, output, input)

    # -- full parameters -------------------------------------------------------------------
    @property
    def current(self) -> bool:
        """The buffer holds the shards as they are now (or a gather of them is under way)."""
        return self.gathered and self.generation == self.stats.generation

    def start_gather(self, async_op: bool) -> None:
        """Gather every rank's shard into the buffer, unless it already holds them. The bytes
        count as gathered from here on: an asynchronous gather fills the pages meanwhile."""
        if self.current:
            return
        self.wait_gather()  # an outdated gather still under way must land first
        self.generation = self.stats.generation
        if not self.gathered:
            self.stats.add(self.buffer.nbytes)
            self.gathered = True
        source = self.shard.array.astype(self.compute_dtype, copy=False)
        if self.layout.shards > 1 and np.may_share_memory(source, self.buffer.array):
            source = source.copy()  # the buffer's own slice: all-gather from a copy of it
        if self.layout.shards == 1:  # nothing to fetch: every rank holds the whole vector
            if not np.may_share_memory(source, self.buffer.array):
                self.buffer.array[...] = source
            return
        work = collectives.all_gather_into_tensor(self.buffer.array, source, group=self.group,
                                                  async_op=async_op)
        if async_op:
            self._pending = (work, source)

    def wait_gather(self) -> None:
        if self._pending is not None:
            work, _ = self._pending
            self._pending = None
            work.wait()

    def gather(self) -> None:
        self.start_gather(async_op=False)
        self.wait_gather()

    def release(self) -> None:
        """Free the full parameters' memory (ZeRO-3); the views read zeros until regathered."""
        self.wait_gather()
        if self.gathered:
            self.buffer.release()
            self.stats.remove(self.buffer.nbytes)
            self.gathered = False

    def gather_master(self) -> np.ndarray:
        """The full padded flat vector in the parameters' own dtype, in a fresh array."""
        if self.layout.shards == 1:
            return self.shard.array.copy()
        full = np.empty(self.layout.padded_numel, dtype=self.master_dtype)
        collectives.all_gather_into_tensor(full, self.shard.array, group=self.group)
        return full

    # -- gradients -------------------------------------------------------------------------
    def begin_backward(self) -> None:
        self.ready = 0
        self.completed = False
        self.pre_backward_done = False

    def grad_arrived(self) -> bool:
        """Count one parameter's final gradient; True when it was the unit's last."""
        self.ready += 1
        return self.ready == len(self.params)

    def pack_and_launch_reduce(self) -> None:
        """Move the full gradients into one flat vector (dropping them: only the shard keeps
        a gradient) and start averaging it: reduce-scatter, or all-reduce when unsharded."""
        flat = self.layout.flatten([None if p.grad is None else p.grad.array for p in self.params],
                                  self.reduce_dtype)
        for param in self.params:
            param.grad = None
        op = ReduceOp.AVG
        if self.reduce_dtype.itemsize < 4 and self.world > 1:
            # A float16 sum of N gradients can overflow where their mean would not: divide
            # first, then add (the mean again, computed in range).
            flat *= flat.dtype.type(1.0 / self.world)
            op = ReduceOp.SUM
        if self.world == 1:
            self._reduce = (None, flat[self.lo:self.hi], flat)
        elif self.layout.shards == 1:
            work = collectives.all_reduce(flat, op, group=self.group, async_op=True)
            self._reduce = (work, flat, flat)
        else:
            out = np.empty(self.layout.shard_numel, dtype=self.reduce_dtype)
            work = collectives.reduce_scatter_tensor(out, flat, op, group=self.group,
                                                     async_op=True)
            self._reduce = (work, out, flat)

    def finish_reduce(self) -> None:
        """Wait for the averaged gradient and add it to the shard's (accumulating, as a
        parameter's ``.grad`` does)."""
        work, out, _ = self._reduce
        self._reduce = None
        if work is not None:
            work.wait()
        if self.shard.grad is not None:
            self.shard.grad.array += out
        else:
            # ``out`` (or the vector it is a slice of) was allocated for this reduction alone
            # and nothing else refers to it: in the shard's dtype it becomes the gradient as is
            self.shard.grad = out.astype(self.master_dtype, copy=False)

    def abandon(self) -> None:
        """After a failed backward: wait for what is under way, keep no half results."""
        pending, self._reduce = self._reduce, None
        if pending is not None and pending[0] is not None:
            pending[0].wait()
        self.wait_gather()
