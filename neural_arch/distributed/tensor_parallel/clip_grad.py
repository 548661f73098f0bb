"""Gradient clipping for a model split over ranks: by the norm of the whole model's gradient.

``optim.clip_grad_norm_`` on one rank's parameters sees that rank's part only. Under tensor
parallelism each rank would clip by the norm of its own shards, and a replicated parameter (a
LayerNorm, held whole by every rank of the group) would count once per rank; under pipeline
parallelism each stage would clip by its own layers. Here each rank adds up its share of the
norm (``norm_parameters``: every sharded parameter, a replicated one on the group's rank 0
only; the caller drops a weight tied across pipeline stages everywhere but on its first
holder), the shares are combined over the given groups (the tensor-parallel group, then the
pipeline group), and every rank scales its gradients by the same factor. The result is
``optim.clip_grad_norm_`` on the dense model, as Megatron-LM's ``clip_grad_norm_fp32`` is.
Data-parallel replicas need no part in it: their averaged gradients are already equal.
"""
from __future__ import annotations

import math
from typing import Any, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from ...backends import xp_of
from ...nn import Module
from .. import collectives
from ..group.world import ProcessGroup, resolve_group
from ..reduce_ops import ReduceOp

__all__ = ["clip_grad_norm_", "grad_norm", "norm_parameters"]


def _unique(parameters: Iterable[Any]) -> List[Any]:
    return list({id(p): p for p in parameters}.values())  # a tied matrix once


def norm_parameters(module: Module) -> Tuple[List[Any], Optional[ProcessGroup]]:
    """(the parameters whose gradients make this rank's share of ``module``'s gradient norm,
    the tensor-parallel group the shares are summed over). Without tensor-parallel layers: every
    parameter, and None. Layers split over different groups raise a ValueError."""
    group, sharded = None, set()
    for name, sub in module.named_modules():
        layouts = getattr(sub, "tp_layout", None)
        if layouts is None:
            continue
        mine = resolve_group(sub.group)
        if group is not None and tuple(group.ranks) != tuple(mine.ranks):
            raise ValueError(f"norm_parameters: '{name}' is split over ranks {list(mine.ranks)}, "
                             f"an earlier layer over {list(group.ranks)}; one tensor-parallel "
                             "group per model")
        group = mine
        sharded.update(id(param) for key, param in sub.named_parameters(recurse=False)
                       if layouts.get(key) is not None)
    params = _unique(module.parameters())
    if group is None:
        return params, None
    first = group.rank == 0
    return [p for p in params if id(p) in sharded or first], group


def grad_norm(parameters: Iterable[Any], norm_type: float = 2.0, *,
              counted: Optional[Iterable[Any]] = None,
              groups: Sequence[Optional[ProcessGroup]] = ()) -> float:
    """The norm of the whole model's gradient, the same on every rank (see ``clip_grad_norm_``
    for the arguments), accumulated in float64."""
    norm_type = float(norm_type)
    if not (norm_type == math.inf or (math.isfinite(norm_type) and norm_type > 0)):
        raise ValueError(f"grad_norm: norm_type must be a positive number or math.inf, got "
                         f"{norm_type}")
    local = 0.0
    for p in _unique(parameters if counted is None else counted):
        if p.grad is None or p.grad.array.size == 0:
            continue
        flat = p.grad.array.ravel().astype(np.float64, copy=False)
        if norm_type == 2.0:  # the common case: one dot product, no absolute values
            local += float(flat @ flat)
            continue
        flat = xp_of(flat).abs(flat)
        if norm_type == math.inf:
            biggest = float(flat.max())
            local = biggest if biggest > local or math.isnan(biggest) else local  # NaN stays
        else:
            local += float((flat ** norm_type).sum())
    value = np.array([local], dtype=np.float64)
    op = ReduceOp.MAX if norm_type == math.inf else ReduceOp.SUM
    for group in groups:
        if resolve_group(group).size > 1:
            collectives.all_reduce(value, op, group=group)
    return float(value[0]) if norm_type == math.inf else float(value[0]) ** (1.0 / norm_type)


def clip_grad_norm_(parameters: Iterable[Any], max_norm: float, norm_type: float = 2.0, *,
                    counted: Optional[Iterable[Any]] = None,
                    groups: Sequence[Optional[ProcessGroup]] = (),
                    error_if_nonfinite: bool = False) -> np.float64:
    """Scale the gradients of ``parameters`` so the norm of the whole model's gradient is at
    most ``max_norm``; returns that norm before clipping, the same on every rank.

    ``counted``: the parameters whose gradients make this rank's share (default: all of
    ``parameters``); ``groups``: the groups the shares are combined over, in order (every rank
    of each must call this; None is the world, as for the collectives). With neither, this is
    ``optim.clip_grad_norm_``. ``norm_type``: a positive number or ``math.inf``. The scale is
    ``max_norm / (norm + 1e-6)``, applied only when below 1 (and by NaN for a NaN norm, as
    PyTorch does)."""
    params = _unique(parameters)
    total = grad_norm(params, norm_type, counted=counted, groups=groups)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(f"the total norm of order {float(norm_type)} of the gradients is "
                           f"{total}; set error_if_nonfinite=False to clip anyway")
    coef = float(max_norm) / (total + 1e-6)
    if not coef >= 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.array *= coef
    return np.float64(total)
