"""``ZeroRedundancyOptimizer``: ZeRO stage 1, PyTorch's ``torch.distributed.optim`` class.

Data parallelism keeps on every rank the full parameters, the full gradients and the full
optimizer state. The state is the largest of the three for Adam (two arrays per parameter),
yet a rank only needs the state of the parameters it updates. ZeRO-1 therefore splits the
parameters over the ranks (``sharding.partition_parameters``): each rank builds the wrapped
optimizer over its share only and updates only that share; per rank the memory is

    full parameters + full gradients + optimizer state / N.

Per step the gradients are averaged as usual (DDP's all-reduce, unchanged), then
``step()`` updates the local share and runs one ``all_gather_into_tensor`` per parameter dtype
that moves every rank's updated share to all others: each rank receives the parameters it
does not own, about ``(N - 1) / N`` of the model (plus the padding of the pieces), in a few
large messages. ``consolidate_state_dict`` is the only other traffic: a gather of the local
states to one rank, when a checkpoint is written.

The all-gather lands in a flat host buffer the size of the parameters, out of which the other
ranks' values are copied into the parameters. ``parameters_as_bucket_view=True`` makes the
parameters views of that buffer instead: no copy, and no second copy of the parameters in
memory (NumPy parameters only). Without it, on the whole world of an ``shm`` transport, the
shares go through shared memory instead of an all-gather, one copy per reader
(``shared_exchange``).

``overlap_with_ddp=True`` moves the step into DDP's communication hook, bucket by bucket, each
updated bucket broadcast by its owner while later buckets are still averaged, or, on DDP's
shared-memory buckets, handed on through shared memory (``zero_overlap``; the hooks:
``comm_hooks.ddp_zero_hook``).
"""
from __future__ import annotations

import copy
import warnings
from typing import Any, Callable, Dict, Iterable, List, Optional, Type

from ...optim import Optimizer
from .. import collectives
from ..group import resolve_group
from .consolidation import not_consolidated
from .same_parameters import check_same_parameters
from .shared_exchange import SharedShardExchange
from .sharding import ShardExchange, partition_parameters
from .zero_overlap import OverlapWithDDP


class ZeroRedundancyOptimizer(OverlapWithDDP, Optimizer):
    """Wraps ``optimizer_class`` so that each rank of ``process_group`` keeps the optimizer
    state of its share of the parameters only (see the module docstring).

    ``param_groups`` hold every parameter, as for a plain optimizer, so learning-rate
    schedulers work unchanged: ``step()`` first copies the groups' hyperparameters into the
    local optimizer (``.optim``, built over this rank's share), steps it, then all-gathers
    the updated shares so that every replica holds the same parameters. Every rank must call
    ``step()`` (a rank that owns nothing still takes part in the all-gather). ``state`` is the
    local optimizer's state: only this rank's share.

    Checkpoints follow PyTorch: ``consolidate_state_dict(to=0)``, called on every rank, gathers
    every rank's local state on rank ``to``; ``state_dict()`` on that rank then returns the full
    state in the standard optimizer format (parameters numbered over all groups), which loads
    into a plain optimizer or into a ``ZeroRedundancyOptimizer`` of any world size.
    ``state_dict()`` raises RuntimeError on the other ranks, before any consolidation, and, unlike
    PyTorch, after a ``step()`` that followed the consolidation (the gathered copy would be
    stale); on a group of one rank it needs no consolidation. ``load_state_dict(full)``, called
    on every rank with the full dict, keeps the entries of this rank's share and every group's
    hyperparameters.

    ``parameters_as_bucket_view=True`` makes the parameters views into the flat buffer the
    all-gather fills (see the module docstring). ``add_param_group`` works as in PyTorch;
    every rank must call it with the same shapes.

    ``overlap_with_ddp=True`` (PyTorch's): the owners update the parameters inside DDP's
    backward, through the hook ``hook_with_zero_step(hook, ddp, zero)`` (or its interleaved
    form) registered on ``ddp``; the parameters are then dealt out by DDP bucket, the hook
    splits them when it is built (checkpoints and ``step()`` refuse before that),
    ``parameters_as_bucket_view`` is ignored and ``add_param_group`` refused, and ``step()``
    only checks that the hook updated the parameters (see ``zero_overlap``).
    """

    def __init__(self, params: Iterable[Any], optimizer_class: Type[Optimizer],
                 process_group: Any = None, parameters_as_bucket_view: bool = False,
                 overlap_with_ddp: bool = False, **defaults: Any) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(f"ZeroRedundancyOptimizer needs optimizer_class to be an Optimizer "
                            f"subclass (SGD, Adam, ...), got {optimizer_class!r}")
        self._initialized = False
        self._overlap_with_ddp = bool(overlap_with_ddp)
        super().__init__(params, defaults)
        self.optimizer_class = optimizer_class
        self.process_group = process_group
        pg = resolve_group(process_group)
        if not pg.is_member:
            raise ValueError(f"ZeroRedundancyOptimizer: rank {pg.global_rank} is not a member of "
                             f"the process group (ranks {list(pg.ranks)})")
        self.rank, self.world_size, self._ranks = pg.rank, pg.size, pg.ranks
        self.parameters_as_bucket_view = bool(parameters_as_bucket_view)
        self._check_replicas_agree()
        if self._overlap_with_ddp:
            if self.parameters_as_bucket_view:
                warnings.warn("ZeroRedundancyOptimizer: parameters_as_bucket_view=True is "
                              "ignored with overlap_with_ddp=True, which broadcasts DDP's "
                              "buckets instead", UserWarning, stacklevel=2)
                self.parameters_as_bucket_view = False
            self._start_overlap(defaults)  # the split waits for DDP's buckets (the hook)
        else:
            self._partition = partition_parameters(self.param_groups, self.world_size)
            local = [dict(group, params=share)
                     for group, share in zip(self.param_groups, self._partition[self.rank])]
            self.optim = optimizer_class(local, **defaults)
        # The local optimizer filled in its own defaults (momentum=0, say): show them here too,
        # so that schedulers find every hyperparameter in ``param_groups``.
        _copy_hyperparameters(self.optim.param_groups, self.param_groups)
        self.state = self.optim.state
        # None on one rank (nothing to exchange) and under overlap (the hook broadcasts)
        self._exchange = None if self._overlap_with_ddp else self._new_exchange()
        self._gathered: Optional[List[Dict[str, Any]]] = None  # consolidated local states
        self._initialized = True

    # -- construction ---------------------------------------------------------------------
    def _check_replicas_agree(self) -> None:
        check_same_parameters(self.param_groups, self.process_group, self._ranks,
                              "ZeroRedundancyOptimizer")

    def _new_exchange(self):
        """How the updated shares reach every rank: through shared memory on the whole world
        of an shm transport (``shared_exchange``), by an all-gather elsewhere or with
        ``parameters_as_bucket_view`` (``sharding.ShardExchange``); None on one rank."""
        if self.world_size == 1:
            return None
        if not self.parameters_as_bucket_view:
            shared = SharedShardExchange.open(self._partition, self.rank, self.process_group)
            if shared is not None:
                return shared
        return ShardExchange(self._partition, self.rank, self.process_group,
                             self.parameters_as_bucket_view)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group (on every rank, the same shapes): it is split over the ranks like the
        others, and this rank's share joins the local optimizer. The earlier groups keep
        their assignment, so no state moves."""
        if self._initialized and self._overlap_with_ddp:
            raise RuntimeError(
                "ZeroRedundancyOptimizer(overlap_with_ddp=True) does not take add_param_group: "
                "its parameters are dealt out by DDP bucket; pass every group to the "
                "constructor")
        super().add_param_group(param_group)
        if not self._initialized:
            return  # the base constructor adding the initial groups
        try:
            self._check_replicas_agree()
        except ValueError:
            self.param_groups.pop()
            raise
        self._partition = partition_parameters(self.param_groups, self.world_size)
        self.optim.add_param_group(dict(self.param_groups[-1],
                                        params=self._partition[self.rank][-1]))
        _copy_hyperparameters(self.optim.param_groups[-1:], self.param_groups[-1:])
        self._exchange = self._new_exchange()
        self._gathered = None

    # -- training -------------------------------------------------------------------------
    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Update this rank's share with the current hyperparameters, then all-gather the
        shares. Returns the closure's loss (the local optimizer evaluates the closure).
        Under ``overlap_with_ddp`` the hook has updated the parameters already: this evaluates
        the closure and checks that it did (RuntimeError if not)."""
        if self._overlap_with_ddp:
            return self._overlap_step(closure)
        self._sync_hyperparameters()
        before_step = getattr(self._exchange, "before_step", None)
        if before_step is not None:  # shared memory: the owners update in place there
            before_step()
        loss = self.optim.step(closure=closure)
        if self._exchange is not None:
            self._exchange.exchange()
        self._gathered = None
        return loss

    def owned_parameters(self, rank: Optional[int] = None) -> List[Any]:
        """The parameters whose optimizer state group rank ``rank`` (default: this rank)
        keeps and updates."""
        self._check_attached("owned_parameters()")
        rank = self.rank if rank is None else rank
        return [p for share in self._partition[rank] for p in share]

    # -- checkpoints ----------------------------------------------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's local optimizer state on global rank ``to`` (call on every
        rank); afterwards ``state_dict()`` on ``to`` returns the full state."""
        self._check_attached("consolidate_state_dict()")
        local = self.optim.state_dict()
        self._gathered = collectives.gather_object(local, dst=to, group=self.process_group)

    def state_dict(self) -> Dict[str, Any]:
        """The full state in the standard optimizer format, on the rank that received
        ``consolidate_state_dict`` (see the class docstring); RuntimeError elsewhere."""
        self._check_attached("state_dict()")
        if self._gathered is None and self.world_size == 1:
            self._gathered = [self.optim.state_dict()]  # one rank holds everything already
        if self._gathered is None:
            raise not_consolidated("ZeroRedundancyOptimizer", self._ranks[self.rank],
                                   self.world_size)
        index_of = {id(p): i for i, p in enumerate(self._ordered_params())}
        state = {}
        for rank, local in enumerate(self._gathered):
            for saved, share in zip(local["param_groups"], self._partition[rank]):
                for local_index, param in zip(saved["params"], share):
                    if local_index in local["state"]:
                        state[index_of[id(param)]] = copy.deepcopy(local["state"][local_index])
        groups = [dict({k: copy.deepcopy(v) for k, v in group.items() if k != "params"},
                       params=[index_of[id(p)] for p in group["params"]])
                  for group in self.param_groups]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a full state dict (from ``state_dict()`` after consolidation, or from a plain
        optimizer): this rank keeps its share's entries; every group takes the saved
        hyperparameters. Call on every rank."""
        self._check_attached("load_state_dict()")
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"loaded state dict has {len(saved_groups)} parameter groups, the optimizer has "
                f"{len(self.param_groups)}")
        params_by_index: Dict[int, Any] = {}
        for i, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"parameter group {i} has {len(saved['params'])} parameters in the loaded "
                    f"state dict and {len(group['params'])} in the optimizer")
            params_by_index.update(zip(saved["params"], group["params"]))
        local_index = {id(p): i for i, p in enumerate(self.owned_parameters())}
        local_state = {}
        for index, entry in state_dict["state"].items():
            if int(index) not in params_by_index:
                raise ValueError(f"loaded optimizer state refers to unknown parameter index "
                                 f"{index}")
            param = params_by_index[int(index)]
            if id(param) in local_index:
                local_state[local_index[id(param)]] = entry
        local_groups, start = [], 0
        for saved, share in zip(saved_groups, self._partition[self.rank]):
            hyper = {k: v for k, v in saved.items() if k != "params"}
            local_groups.append(dict(hyper, params=list(range(start, start + len(share)))))
            start += len(share)
        # The local optimizer checks each entry's shapes and copies the arrays.
        self.optim.load_state_dict({"state": local_state, "param_groups": local_groups})
        self.state = self.optim.state
        for saved, group in zip(saved_groups, self.param_groups):
            group.update({k: copy.deepcopy(v) for k, v in saved.items() if k != "params"})
        self._gathered = None

    def _sync_hyperparameters(self) -> None:
        """The groups' hyperparameters (a scheduler may have changed them) into ``.optim``."""
        _copy_hyperparameters(self.param_groups, self.optim.param_groups)

    def __repr__(self) -> str:
        owned = "?" if self._partition is None else len(self.owned_parameters())
        return (f"ZeroRedundancyOptimizer(optimizer_class={self.optimizer_class.__name__}, "
                f"rank={self.rank}, world_size={self.world_size}, "
                f"owned={owned}/{len(self._ordered_params())} parameters"
                f"{', overlap_with_ddp=True' if self._overlap_with_ddp else ''})")


def _copy_hyperparameters(source: List[Dict[str, Any]], target: List[Dict[str, Any]]) -> None:
    """Every key but ``params`` of each source group into the matching target group."""
    for src, dst in zip(source, target):
        dst.update({k: v for k, v in src.items() if k != "params"})


__all__ = ["ZeroRedundancyOptimizer"]
