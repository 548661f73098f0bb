"""Between a model's dense state and its tensor-parallel shards, for checkpoints and tests.

Any module built of tensor-parallel layers (and ordinary replicated ones) whose parameter
names are those of its dense counterpart works: the tensor-parallel GPT keeps the dense GPT's
module names, so its ``state_dict()`` has the dense keys with each rank's shapes. Every parallel
layer's ``tp_layout`` says which part of each of its parameters a rank holds; a parameter of any
other module is replicated and taken or given whole.

``load_dense_state_dict(module, dense)``: each rank takes its shards of a dense state dict.
``dense_state_dict(module)``: every sharded parameter is all-gathered over its layer's group and
rebuilt; the result has exactly the dense keys and shapes, identical on every rank of the group.
Every rank of each group must call it (it is a sequence of collectives, in state-dict order). A
parameter shared under two names (a tied LM head) is gathered once.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, Optional, Tuple

import numpy as np

from ...nn import Module
from ...nn.module_state import state_dict_copy
from .. import collectives
from .layout import Layout

__all__ = ["load_dense_state_dict", "dense_state_dict"]


def _layout_of(owner: Module, name: str) -> Tuple[Optional[Layout], Any]:
    """(layout, owner) of parameter ``name`` of ``owner``: None for a replicated one."""
    layouts = getattr(owner, "tp_layout", None)
    return (layouts.get(name) if layouts else None), owner


def load_dense_state_dict(module: Module, dense_state: Dict[str, Any], strict: bool = True):
    """Load this rank's shards of ``dense_state`` (a dense model's ``state_dict()``) into
    ``module``; returns ``load_state_dict``'s missing and unexpected keys."""
    local: "OrderedDict[str, Any]" = OrderedDict()
    for key, (owner, table, name) in module._state_targets().items():
        if key not in dense_state:
            continue
        source = np.asarray(dense_state[key])
        layout, _ = _layout_of(owner, name) if table == "_parameters" else (None, owner)
        if layout is None:
            local[key] = source
            continue
        current = getattr(owner, table)[name]
        want = layout.dense_shape(tuple(current.shape), owner.tp_size)
        if tuple(source.shape) != want:
            raise ValueError(f"load_dense_state_dict: '{key}' has dense shape "
                             f"{tuple(source.shape)}, the tensor-parallel layer needs {want} "
                             f"(tp={owner.tp_size}, rank {owner.tp_rank})")
        local[key] = layout.shard(source, owner.tp_rank, owner.tp_size)
    unexpected = [key for key in dense_state if key not in local]
    result = module.load_state_dict(local, strict=False)
    missing = list(result.missing_keys)
    if strict and (missing or unexpected):
        raise KeyError(f"load_dense_state_dict into {type(module).__name__}: missing keys "
                       f"{missing}, unexpected keys {unexpected}")
    return type(result)(missing, unexpected)


def _gather(local: np.ndarray, layout: Layout, owner: Module) -> np.ndarray:
    shards = np.empty((owner.tp_size,) + local.shape, dtype=local.dtype)
    collectives.all_gather_into_tensor(shards, np.ascontiguousarray(local), group=owner.group)
    return layout.unshard(list(shards))


def dense_state_dict(module: Module) -> "OrderedDict[str, np.ndarray]":
    """The dense state dict (host NumPy arrays) rebuilt from every rank's shards."""
    local = state_dict_copy(module)  # host arrays, as the gathered entries
    done: Dict[int, np.ndarray] = {}
    dense: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for key, (owner, table, name) in module._state_targets().items():
        layout, _ = _layout_of(owner, name) if table == "_parameters" else (None, owner)
        if layout is None or owner.tp_size == 1:
            dense[key] = local[key]
            continue
        param = getattr(owner, table)[name]
        if id(param) not in done:
            done[id(param)] = _gather(local[key], layout, owner)
        dense[key] = done[id(param)].copy()
    return dense
