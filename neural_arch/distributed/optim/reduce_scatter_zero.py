"""``ReduceScatterZeroOptimizer``: ZeRO stage 1 as DeepSpeed runs it, the ``"zero1"`` strategy's
optimizer.

``ZeroRedundancyOptimizer`` (PyTorch's) sits on top of DDP: DDP all-reduces every gradient,
2(N-1)/N of the model per rank with a ring, although each rank then updates only its share,
and the updated shares are all-gathered, (N-1)/N more: 3(N-1)/N in all. Here the gradients are
reduce-scattered instead: each rank receives the average of its own shard only ((N-1)/N), steps
it, and the all-gather ((N-1)/N) brings the other shards: 2(N-1)/N per step, DeepSpeed's figure.

The shards are contiguous 1/N pieces of each parameter group's flattened parameters
(``flat_shards``), so every rank holds the optimizer state of Ψ/N elements exactly, whatever
the parameters' sizes. Per rank: the parameters (one flat buffer, the parameters are views of
it), the gradients (a flat buffer the reduce-scatter reads), and the optimizer state of a
shard: 8Ψ + 8Ψ/N bytes for float32 Adam.

Use: ``zero_grad()``, backward (local gradients, no DDP), then ``step()``, which averages the
gradients (``reduce_gradients()``, unless called already: a trainer calls it first to clip
by the global norm of the averaged shards, ``shard_parameters()``), steps this rank's shards
and all-gathers them. Every rank of ``process_group`` calls each of these. ``state_dict()``
after ``consolidate_state_dict(to)`` on rank ``to`` is the standard per-parameter format,
which loads into a plain optimizer, a ``ZeroRedundancyOptimizer`` or this one at any world
size (``load_state_dict`` on every rank). Host NumPy parameters only.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterable, List, Optional, Type

import numpy as np

from ...optim import Optimizer
from .. import collectives
from ..group import resolve_group
from .consolidation import not_consolidated
from .flat_shards import FlatShards, is_elementwise
from .same_parameters import check_same_parameters


class ReduceScatterZeroOptimizer(Optimizer):
    """See the module docstring. ``.optim`` is the local optimizer over this rank's shards."""

    def __init__(self, params: Iterable[Any], optimizer_class: Type[Optimizer],
                 process_group: Any = None, **defaults: Any) -> None:
        if not (isinstance(optimizer_class, type) and issubclass(optimizer_class, Optimizer)):
            raise TypeError(f"ReduceScatterZeroOptimizer needs optimizer_class to be an "
                            f"Optimizer subclass (SGD, Adam, ...), got {optimizer_class!r}")
        super().__init__(params, defaults)
        self.optimizer_class, self.process_group = optimizer_class, process_group
        pg = resolve_group(process_group)
        if not pg.is_member:
            raise ValueError(f"ReduceScatterZeroOptimizer: rank {pg.global_rank} is not a member "
                             f"of the process group (ranks {list(pg.ranks)})")
        self.rank, self.world_size, self._to = pg.rank, pg.size, pg.ranks
        self._check_replicas_agree()
        # one flat layout per (group, dtype), in the order of first appearance: every rank alike
        self.flats: List[FlatShards] = []
        self._group_of: List[int] = []
        for g, group in enumerate(self.param_groups):
            for dtype in dict.fromkeys(np.dtype(p.array.dtype) for p in group["params"]):
                same = [p for p in group["params"] if np.dtype(p.array.dtype) == dtype]
                self.flats.append(FlatShards(same, self.rank, self.world_size))
                self._group_of.append(g)
        local = [dict(self._hyper(self.param_groups[g]), params=[flat.shard])
                 for flat, g in zip(self.flats, self._group_of)]
        self.optim = optimizer_class(local, **defaults)
        for flat, g in zip(self.flats, self._group_of):  # the local optimizer's own defaults
            for key, value in self.optim.param_groups[0].items():
                if key != "params":
                    self.param_groups[g].setdefault(key, value)
        self.state = self.optim.state
        self._reduced = False  # the gradients of this step were averaged already
        self._gathered: Optional[List[Any]] = None

    @staticmethod
    def _hyper(group: Dict[str, Any]) -> Dict[str, Any]:
        return {k: v for k, v in group.items() if k != "params"}

    def _check_replicas_agree(self) -> None:
        check_same_parameters(self.param_groups, self.process_group, self._to,
                              "ReduceScatterZeroOptimizer")

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        if getattr(self, "flats", None) is not None:
            raise NotImplementedError("ReduceScatterZeroOptimizer.add_param_group after "
                                      "construction: pass every group to the constructor")
        super().add_param_group(param_group)

    # -- training -------------------------------------------------------------------------
    def shard_parameters(self) -> List[Any]:
        """The tensors this rank steps: one flat shard per parameter group and dtype; after
        ``reduce_gradients()`` their ``.grad`` is this rank's part of the averaged gradient."""
        return [flat.shard for flat in self.flats]

    def reduce_gradients(self) -> None:
        """Average the gradients over the group, each rank receiving its shards' part."""
        for flat in self.flats:
            flat.reduce_gradients(self.process_group)
        self._reduced = True

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        """Average the gradients (if ``reduce_gradients()`` was not called since the last
        step), update this rank's shards with the groups' current hyperparameters, then
        all-gather the shards. Returns the closure's loss."""
        loss = self._evaluate_closure(closure)
        for flat in self.flats:
            flat.reattach()
        if not self._reduced:
            self.reduce_gradients()
        for local, g in zip(self.optim.param_groups, self._group_of):
            local.update(self._hyper(self.param_groups[g]))
        self.optim.step()
        for flat in self.flats:
            flat.gather_parameters(self.process_group)
            flat.shard.grad = None
        self._reduced = False
        self._gathered = None
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for flat in self.flats:
            flat.shard.grad = None
        self._reduced = False

    # -- checkpoints: the standard per-parameter format -----------------------------------
    def consolidate_state_dict(self, to: int = 0) -> None:
        """Gather every rank's shard state on global rank ``to`` (call on every rank)."""
        local = [self.optim.state[flat.shard] if flat.shard in self.optim.state else {}
                 for flat in self.flats]
        self._gathered = collectives.gather_object(local, dst=to, group=self.process_group)

    def state_dict(self) -> Dict[str, Any]:
        if self._gathered is None and self.world_size == 1:
            self.consolidate_state_dict(to=self._to[0])
        if self._gathered is None:
            raise not_consolidated("ReduceScatterZeroOptimizer", self._to[self.rank],
                                   self.world_size)
        index_of = {id(p): i for i, p in enumerate(self._ordered_params())}
        state: Dict[int, Dict[str, Any]] = {}
        for f, flat in enumerate(self.flats):
            shards = [ranks_state[f] for ranks_state in self._gathered]
            if not shards[0]:
                continue
            for key, value in shards[0].items():
                if is_elementwise(value, flat.shard_size):
                    whole = np.concatenate([s[key] for s in shards])
                    for p, lo, hi in zip(flat.params, flat.offsets, flat.offsets[1:]):
                        entry = state.setdefault(index_of[id(p)], {})
                        entry[key] = whole[lo:hi].reshape(p.array.shape).copy()
                else:
                    for p in flat.params:
                        state.setdefault(index_of[id(p)], {})[key] = copy.deepcopy(value)
        groups = [dict(copy.deepcopy(self._hyper(g)), params=[index_of[id(p)] for p in g["params"]])
                  for g in self.param_groups]
        return {"state": dict(sorted(state.items())), "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Load a full per-parameter state dict (every rank): this rank keeps its shards'
        parts, and every group takes the saved hyperparameters."""
        saved_groups = state_dict["param_groups"]
        if [len(g["params"]) for g in saved_groups] != [len(g["params"])
                                                         for g in self.param_groups]:
            raise ValueError(f"loaded state dict has groups of "
                             f"{[len(g['params']) for g in saved_groups]} parameters, the "
                             f"optimizer {[len(g['params']) for g in self.param_groups]}")
        index_of = {id(p): i for i, p in enumerate(self._ordered_params())}
        saved = {int(k): v for k, v in state_dict["state"].items()}
        for flat in self.flats:
            restored: Dict[str, Any] = {}
            for i, start, stop, at in flat.owned_pieces():
                param = flat.params[i]
                for key, value in saved.get(index_of[id(param)], {}).items():
                    if hasattr(value, "shape") and tuple(value.shape) == param.array.shape:
                        target = restored.setdefault(key, np.zeros(flat.shard_size, flat.dtype))
                        target[at:at + stop - start] = np.asarray(value).reshape(-1)[start:stop]
                    elif hasattr(value, "shape") and len(value.shape) > 0:
                        raise ValueError(f"optimizer state '{key}' of parameter "
                                         f"{index_of[id(param)]} has shape {tuple(value.shape)}, "
                                         f"the parameter {tuple(param.array.shape)}")
                    else:
                        restored[key] = copy.deepcopy(value)
            if restored:
                self.optim.state[flat.shard] = restored
        for group, saved_group in zip(self.param_groups, saved_groups):
            group.update(copy.deepcopy(self._hyper(saved_group)))
        self._gathered = None

    def __repr__(self) -> str:
        return (f"ReduceScatterZeroOptimizer(optimizer_class={self.optimizer_class.__name__}, "
                f"rank={self.rank}, world_size={self.world_size}, "
                f"shard={sum(f.shard_size for f in self.flats)} elements)")


__all__ = ["ReduceScatterZeroOptimizer"]
