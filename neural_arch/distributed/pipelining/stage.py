"""``PipelineStage``: the piece of a model one rank runs, its passes and its tied weights.

A stage runs its module forward on one micro-batch at a time and keeps what backward needs:
the input (a fresh leaf, so backward stops at the stage boundary and its gradient is what goes
back to the previous stage) and the output (or, on the last stage, the loss). Backward frees
both, so a schedule's order alone decides how many micro-batches of activations a rank holds.

Tied weights (a GPT's token embedding, also its LM head) live on two stages. Each stage holds
the same parameter and gets only its own part of the gradient; after the schedule's backwards,
the holders swap their parts and add them in stage order (Megatron-LM all-reduces the
embedding's gradient between the first and last stage the same way), so both hold the
gradient of the whole model and, with the same optimizer, stay equal. On the first step the
lowest holder's value is copied to the others, so they also start equal.
"""
from __future__ import annotations

import contextlib

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from ...core import Tensor
from ...nn import Module
from ..collectives import point_to_point as p2p
from ..group.world import ProcessGroup, resolve_group

_TIE_TAG = 4


def _is_float(dtype: Any) -> bool:
    return np.dtype(dtype).kind in "fc"


def _array(value: Any) -> np.ndarray:
    return np.asarray(value.array if isinstance(value, Tensor) else value)


class PipelineStage:
    """The piece of the model this rank runs: ``submodule`` as stage ``stage_index`` of
    ``num_stages``, over the ranks of ``group`` (``None``: the world).

    Stage ``i`` runs on group rank ``i % group size`` (with one stage per rank, stage ``i`` is
    rank ``i``; the interleaved schedule gives rank ``r`` stages ``r, r + p, ...``). Shapes are
    not declared: every activation travels with a small header (shape, dtype, micro-batch).
    A module made by ``pipeline_split`` may carry ``pipeline_ties`` (see the module docstring).
    """

    def __init__(self, submodule: Module, stage_index: int, num_stages: int,
                 group: Optional[ProcessGroup] = None) -> None:
        if not isinstance(submodule, Module):
            raise TypeError(f"PipelineStage needs a Module, got {type(submodule).__name__}")
        for name, value in (("stage_index", stage_index), ("num_stages", num_stages)):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
                raise TypeError(f"{name} must be an int, got {value!r}")
        if num_stages < 1 or not 0 <= stage_index < num_stages:
            raise ValueError(f"stage_index {stage_index} is outside [0, {num_stages}) "
                             f"(num_stages={num_stages})")
        self.submodule, self.stage_index, self.num_stages = submodule, int(stage_index), \
            int(num_stages)
        self.group = resolve_group(group)
        size = self.group.size
        if self.num_stages % size:
            raise ValueError(f"num_stages {num_stages} must be a multiple of the pipeline "
                             f"group's size {size} (one or more stages per rank)")
        if self.stage_index % size != self.group.rank:
            raise ValueError(f"stage {stage_index} of {num_stages} runs on group rank "
                             f"{self.stage_index % size}, but this is group rank "
                             f"{self.group.rank} of {size}")
        self.is_first = self.stage_index == 0
        self.is_last = self.stage_index == self.num_stages - 1
        inner = getattr(submodule, "module", submodule)  # a wrapper's (DDP's) model
        self.ties: Dict[str, Tuple[Any, Tuple[int, ...]]] = dict(
            getattr(submodule, "pipeline_ties", None) or getattr(inner, "pipeline_ties", {})
            or {})
        self._ties_synced = False
        self._inputs: Dict[int, Any] = {}
        self._outputs: Dict[int, Tensor] = {}

    def rank_of(self, stage_index: int) -> int:
        """The global rank that runs stage ``stage_index``."""
        return self.group.ranks[stage_index % self.group.size]

    # ----- passes ------------------------------------------------------------------------
    def forward_one(self, mb: int, value: Any, loss_fn: Optional[Callable] = None,
                    target: Any = None, losses: Optional[list] = None) -> Tensor:
        """Forward of micro-batch ``mb``: ``value`` is the batch slice on the first stage, the
        received activation elsewhere. The last stage returns (and keeps) the loss."""
        if self.is_first:
            x = value
            if not isinstance(x, Tensor) and _is_float(_array(x).dtype):
                x = Tensor(_array(x))  # token ids stay arrays: embeddings take them as they are
        else:
            arr = _array(value)
            x = Tensor(arr, requires_grad=_is_float(arr.dtype))
        out = self.submodule(x)
        if not isinstance(out, Tensor):
            raise TypeError(f"pipeline stage {self.stage_index} returned "
                            f"{type(out).__name__} for micro-batch {mb}; a stage must return "
                            "one Tensor (the activation for the next stage, or the output)")
        if self.is_last:
            if loss_fn is None:
                raise ValueError(f"the last pipeline stage ({self.stage_index}) needs a loss_fn "
                                 "to train: pass loss_fn to the schedule")
            loss = loss_fn(out, target)
            if not isinstance(loss, Tensor) or loss.array.size != 1:
                raise TypeError(f"loss_fn must return a one-element Tensor, got "
                                f"{type(loss).__name__} {getattr(loss, 'shape', '')} for "
                                f"micro-batch {mb} on stage {self.stage_index}")
            if losses is not None:
                # detached: our graphs live as long as their outputs, and the caller's list
                # must not keep every micro-batch's activations alive
                losses.append(loss.detach())
            out = loss
        self._inputs[mb], self._outputs[mb] = x, out
        return out

    def output_meta(self, mb: int) -> Tuple[Tuple[int, ...], np.dtype]:
        """Shape and dtype of micro-batch ``mb``'s output: those of the gradient it gets."""
        out = self._outputs[mb]
        return tuple(out.shape), np.dtype(out.dtype)

    def backward_one(self, mb: int, grad: Any, scale: float, last: bool = True
                     ) -> Optional[np.ndarray]:
        """Backward of micro-batch ``mb`` from ``grad`` (the gradient of its output; on the last
        stage the loss is seeded with ``scale``); returns the gradient of the stage's input
        (None on the first stage) and frees the micro-batch. ``last``: the step's last
        backward on this stage. A submodule with ``no_sync`` (``DistributedDataParallel``)
        accumulates the earlier ones locally, and averages during the last, overlapping its
        all-reduces with that backward (as torch's ``backward_maybe_with_nosync``)."""
        x, out = self._inputs.pop(mb), self._outputs.pop(mb)
        if self.is_last:
            grad = np.full(out.shape, scale, dtype=out.dtype)
        no_sync = None if last else getattr(self.submodule, "no_sync", None)
        with no_sync() if no_sync is not None else contextlib.nullcontext():
            if out.requires_grad:
                out.backward(gradient=grad)
        if self.is_first:
            return None
        if isinstance(x, Tensor) and x.grad is not None:
            return np.asarray(x.grad.array)
        return np.zeros(x.shape, dtype=x.dtype)  # the output did not depend on the input

    @property
    def in_flight(self) -> int:
        """Micro-batches whose activations this stage holds now."""
        return len(self._outputs)

    def clear(self) -> None:
        """Forget held micro-batches (after a failed step)."""
        self._inputs.clear()
        self._outputs.clear()


# ----- tied weights ----------------------------------------------------------------------
def _grad_of(param: Any) -> np.ndarray:
    grad = None if param.grad is None else param.grad.array
    return np.zeros_like(np.asarray(param.array)) if grad is None else np.asarray(grad)


def start_tied_equal(stages: Sequence[PipelineStage]) -> None:
    """Before a stage's first pass: copy each tied weight from its lowest holder to the others
    (once per stage; every rank of the pipeline must call this at the same point)."""
    if all(stage._ties_synced for stage in stages):
        return
    sync_tied(stages, gradients=False)
    for stage in stages:
        stage._ties_synced = True


def tied_elsewhere(stages: Sequence[PipelineStage]) -> set:
    """The ids of this rank's tied weights whose first holder (lowest stage) another rank runs:
    after ``sync_tied`` every holder has the same gradient, which a norm over the whole model
    must count once."""
    ids = set()
    for stage in stages:
        for param, owners in stage.ties.values():
            if stage.rank_of(min(owners)) != stage.group.global_rank:
                ids.add(id(param))
    return ids


def sync_tied(stages: Sequence[PipelineStage], gradients: bool) -> None:
    """Make every holder of each tied weight agree: the sum of the holders' gradients (in stage
    order) when ``gradients``, else the lowest holder's value. ``stages`` are this rank's."""
    if not stages:
        return
    group = stages[0].group
    me = group.global_rank
    local: Dict[str, List[Tuple[int, Any]]] = {}  # key -> [(stage, parameter)] on this rank
    holders: Dict[str, Tuple[int, ...]] = {}
    for stage in stages:
        for key, (param, owners) in stage.ties.items():
            local.setdefault(key, []).append((stage.stage_index, param))
            holders[key] = tuple(sorted(owners))
    for key in sorted(local):
        owners = holders[key]
        ranks = {stage_index: stages[0].rank_of(stage_index) for stage_index in owners}
        remote = sorted({rank for rank in ranks.values() if rank != me})
        if not remote:
            continue  # every holder is on this rank: they share one parameter already
        param = local[key][0][1]
        mine = _grad_of(param) if gradients else np.asarray(param.array)
        lowest = ranks[owners[0]]
        if not gradients and lowest == me:
            ops = [p2p.P2POp("isend", np.ascontiguousarray(mine), rank, group, _TIE_TAG)
                   for rank in remote]
            p2p.batch_isend_irecv(ops)
            continue
        if not gradients:
            got = np.empty_like(mine)
            p2p.batch_isend_irecv([p2p.P2POp("irecv", got, lowest, group, _TIE_TAG)])
            param.array[...] = got
            continue
        theirs = {rank: np.empty_like(mine) for rank in remote}
        ops = [p2p.P2POp("isend", np.ascontiguousarray(mine), rank, group, _TIE_TAG)
               for rank in remote]
        ops += [p2p.P2POp("irecv", buf, rank, group, _TIE_TAG) for rank, buf in theirs.items()]
        p2p.batch_isend_irecv(ops)
        parts = {me: mine, **theirs}
        total = None
        for rank in sorted({ranks[s] for s in owners}, key=lambda r: min(
                s for s in owners if ranks[s] == r)):  # in stage order: equal sums everywhere
            total = parts[rank].copy() if total is None else total + parts[rank]
        param.grad = total.astype(np.asarray(param.array).dtype, copy=False)
