"""``OverlapWithDDP``: what ``ZeroRedundancyOptimizer(overlap_with_ddp=True)`` adds, mixed
into the class (PyTorch's mode of the same name).

Without overlap the optimizer steps after backward, when every gradient is averaged. With it
the step moves into DDP's communication hook (``comm_hooks.ddp_zero_hook``), bucket by bucket
(``overlap_step``; on DDP's shared-memory buckets, right after their averages), so the
parameters are dealt out by DDP bucket (``bucket_assignment``, torch's rule) instead of one by
one, and ``parameters_as_bucket_view`` is ignored. That
split needs DDP's buckets, so it is made when the hook is built (``attach_to_ddp``); until
then the local optimizer holds no parameters, and checkpoints and ``step()`` refuse. Our DDP
fixes its buckets at construction, so the parameters are updated from the first backward on
(torch's DDP rebuilds its buckets after the first iteration, and torch's hook updates nothing
in the first two or three).

``step()`` then has no update left to do: it checks that the hook did update the parameters
since the last ``step()`` (a hook built but never registered, or registered on another DDP,
would leave them untouched without a word), evaluates the closure if given and returns its
loss. On a group of one rank DDP runs no hook and ``step()`` is the plain step.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence

from ..buffers import copy_from_host
from .bucket_assignment import assign_buckets, partition_by_assignment
from .overlap_step import OverlapStep

_HOW = ("ddp.register_comm_hook(state, hook_with_zero_step(allreduce_hook, ddp, zero)) "
        "(neural_arch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook) before the first "
        "backward")


class OverlapWithDDP:
    """The overlap mode of ``ZeroRedundancyOptimizer`` (see the module docstring); relies on
    its ``param_groups``, ``optimizer_class``, ``rank``, ``world_size``, ``_ranks``,
    ``process_group`` and ``_sync_hyperparameters``."""

    def _start_overlap(self, defaults: Dict[str, Any]) -> None:
        """A local optimizer over no parameters (it fills in the defaults the groups show)
        until the hook deals out DDP's buckets."""
        self._defaults = dict(defaults)
        self._overlap: Optional[OverlapStep] = None
        self._layout: Optional[tuple] = None
        self._hook_updates = 0  # backward passes whose hook updated the parameters
        self._partition = None
        self.optim = self.optimizer_class([dict(group, params=[])
                                           for group in self.param_groups], **defaults)

    @property
    def overlap_with_ddp(self) -> bool:
        """Whether this optimizer steps inside DDP's communication hook."""
        return self._overlap_with_ddp

    def _check_attached(self, what: str) -> None:
        if self._overlap_with_ddp and self._overlap is None:
            raise RuntimeError(
                f"ZeroRedundancyOptimizer(overlap_with_ddp=True).{what}: the parameters are "
                f"dealt out by DDP bucket when the hook is built, and no hook was built for "
                f"this optimizer yet; call {_HOW}")

    def attach_to_ddp(self, params_per_bucket: Sequence[Sequence[Any]], ddp_ranks: Sequence[int],
                       shard_buckets: bool, names: Dict[int, str]) -> OverlapStep:
        """Deal DDP's buckets out to the ranks and build the local optimizer over this rank's
        share; called by the hook builders. A second hook for the same DDP shares the first's
        split (and the optimizer state)."""
        if tuple(ddp_ranks) != tuple(self._ranks):
            raise ValueError(
                f"hook_with_zero_step: the DistributedDataParallel averages over ranks "
                f"{list(ddp_ranks)}, the ZeroRedundancyOptimizer shards over ranks "
                f"{list(self._ranks)}; give both the same process group")
        self._check_same_parameters(params_per_bucket, names)
        layout = (tuple(tuple(id(p) for p in params) for params in params_per_bucket),
                  bool(shard_buckets))
        if self._overlap is not None:
            if layout == self._layout:
                return self._overlap
            raise RuntimeError(
                "hook_with_zero_step: this ZeroRedundancyOptimizer already steps inside the "
                "hook of a DistributedDataParallel with other buckets (or another "
                "shard_buckets); build one optimizer per DistributedDataParallel")
        assignments = assign_buckets(params_per_bucket, self.world_size, shard_buckets)
        self._partition = partition_by_assignment(self.param_groups, assignments,
                                                  self.world_size)
        local = [dict(group, params=share)
                 for group, share in zip(self.param_groups, self._partition[self.rank])]
        # the groups carry every hyperparameter: the defaults were filled in at construction
        self.optim = self.optimizer_class(local, **self._defaults)
        self.state = self.optim.state
        self._layout = layout
        self._overlap = OverlapStep(assignments, params_per_bucket, self.rank, self._ranks,
                                    self.process_group, self._step_params,
                                    self._count_hook_update)
        return self._overlap

    def _check_same_parameters(self, params_per_bucket: Sequence[Sequence[Any]],
                               names: Dict[int, str]) -> None:
        ours = [p for group in self.param_groups for p in group["params"]]
        theirs = [p for params in params_per_bucket for p in params]
        mine, ddps = {id(p) for p in ours}, {id(p) for p in theirs}
        if mine == ddps:
            return
        missing = [names.get(id(p), f"shape {tuple(p.array.shape)}")
                   for p in theirs if id(p) not in mine]
        foreign = [tuple(p.array.shape) for p in ours if id(p) not in ddps]
        raise ValueError(
            f"hook_with_zero_step: the ZeroRedundancyOptimizer holds {len(ours)} parameters and "
            f"the DistributedDataParallel's buckets {len(theirs)}; they must be the same ones "
            f"(ZeroRedundancyOptimizer(ddp.parameters(), ...)): DDP's not in the optimizer: "
            f"{missing}; the optimizer's not in DDP's buckets (shapes): {foreign}")

    # -- the step, bucket by bucket --------------------------------------------------------
    def _step_params(self, params: Sequence[Any], grads: Sequence[Optional[Any]]) -> None:
        """The local optimizer's update of ``params`` alone, with ``grads`` (host views of an
        averaged bucket, or arrays of the parameters' own kind; None: no gradient, the
        parameter is skipped as by a plain step) as their gradients for the time of the step:
        the optimizer sees only these parameters, so its per-parameter state and step counts
        advance once per step, as in a plain step."""
        self._sync_hyperparameters()
        wanted = {id(p) for p in params}
        groups = self.optim.param_groups
        saved = [p.grad for p in params]
        self.optim.param_groups = [dict(g, params=[p for p in g["params"] if id(p) in wanted])
                                   for g in groups]
        try:
            for param, grad in zip(params, grads):
                param.grad = grad if grad is None or type(grad) is type(param.array) \
                    else copy_from_host(grad, param.array)
            self.optim.step()
        finally:
            self.optim.param_groups = groups
            for param, grad in zip(params, saved):
                param.grad = grad  # DDP writes the average into it after the hook

    def _count_hook_update(self) -> None:
        self._hook_updates += 1
        self._gathered = None  # a consolidated state is stale now

    def _overlap_step(self, closure: Optional[Callable[[], Any]]) -> Any:
        loss = None if closure is None else closure()
        self._check_attached("step()")
        if not self._hook_updates:
            raise RuntimeError(
                f"ZeroRedundancyOptimizer(overlap_with_ddp=True).step() on rank "
                f"{self._ranks[self.rank]}: DDP's hook has not updated the parameters since "
                f"the last step(), so this step would change nothing. The hook built by "
                f"hook_with_zero_step must be registered with {_HOW}, and step() follows the "
                f"backward that averages the gradients (not one inside no_sync())")
        self._hook_updates = 0
        return loss


__all__ = ["OverlapWithDDP"]
