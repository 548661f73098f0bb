"""``parallelize_module(module, device_mesh, parallelize_plan)``: torch's way of applying
tensor parallelism from outside a model.

The plan maps a submodule's dotted path to the ``ParallelStyle`` for it; a path atom may hold
shell wildcards (``"h.*.mlp.c_fc"`` is that layer of every block). Entries are applied in the
plan's order, each replacing every module it matches by the style's parallel counterpart
(which keeps the dense weights: this rank's shard, or the very parameter when replicated), so
a parent's entry comes before its children's. A plan that is one style applies to ``module``
itself and returns what replaces it.

``device_mesh``: a 1-D ``DeviceMesh``, a ``ProcessGroup``, or None for the whole world.

A parameter two dense layers shared (a GPT's LM head tied to its token embedding) stays shared
when both become parallel layers that split it the same way; split two ways, or split in one
and whole in the other, it raises a ValueError rather than silently untie.
"""
from __future__ import annotations

import fnmatch
from typing import Any, Dict, List, Optional, Tuple

from ...nn import Module
from ..device_mesh import DeviceMesh
from ..group.world import ProcessGroup
from ._group import group_rank_size
from .style import ParallelStyle

__all__ = ["parallelize_module"]


def tensor_parallel_group(device_mesh: Any) -> Optional[ProcessGroup]:
    """The group a mesh argument names (None: the world); this process must belong to it."""
    if isinstance(device_mesh, DeviceMesh):
        if device_mesh.ndim != 1:
            raise ValueError(f"parallelize_module needs a 1-D mesh (the tensor-parallel one, "
                             f"e.g. mesh['tp'] or mesh.get_group('tp')), got dimensions "
                             f"{device_mesh.mesh_dim_names}")
        device_mesh = device_mesh.get_group()
    if device_mesh is not None and not isinstance(device_mesh, ProcessGroup):
        raise TypeError(f"device_mesh must be a 1-D DeviceMesh, a ProcessGroup or None, got "
                        f"{type(device_mesh).__name__}")
    group_rank_size(device_mesh)
    return device_mesh


def _matches(parent: Module, atoms: List[str], prefix: str) -> List[Tuple[Module, str, str]]:
    """(parent, child name, path) of every submodule the atoms match, in module order."""
    found = []
    for name, child in parent._modules.items():
        if child is None or not fnmatch.fnmatchcase(name, atoms[0]):
            continue
        path = f"{prefix}{name}"
        if len(atoms) == 1:
            found.append((parent, name, path))
        else:
            found.extend(_matches(child, atoms[1:], path + "."))
    return found


def _tied_keys(module: Module) -> List[List[str]]:
    """The state-dict keys of each parameter held under more than one name."""
    keys: Dict[int, List[str]] = {}
    for key, (owner, table, name) in module._state_targets().items():
        if table == "_parameters" and owner._parameters[name] is not None:
            keys.setdefault(id(owner._parameters[name]), []).append(key)
    return [names for names in keys.values() if len(names) > 1]


def _retie(module: Module, tied: List[List[str]]) -> None:
    targets = module._state_targets()
    for keys in tied:
        owners = [targets[key] for key in keys]
        first_owner, _, first_name = owners[0]
        first = first_owner._parameters[first_name]
        layout = (getattr(first_owner, "tp_layout", None) or {}).get(first_name)
        for key, (owner, _, name) in zip(keys[1:], owners[1:]):
            param = owner._parameters[name]
            if param is first:
                continue
            other = (getattr(owner, "tp_layout", None) or {}).get(name)
            if other != layout or tuple(param.shape) != tuple(first.shape):
                raise ValueError(f"parallelize_module: '{keys[0]}' and '{key}' were one "
                                 f"parameter, and the plan splits them differently ({layout} "
                                 f"{tuple(first.shape)} and {other} {tuple(param.shape)}); "
                                 "parallelize both the same way")
            owner._store(owner._parameters, name, first)  # in place: the key order stays


def parallelize_module(module: Module, device_mesh: Any = None,
                       parallelize_plan: Any = None) -> Module:
    """Apply ``parallelize_plan`` to ``module`` over ``device_mesh`` (see the module
    docstring); returns ``module`` (or, for a plan that is one style, its replacement)."""
    group = tensor_parallel_group(device_mesh)
    if isinstance(parallelize_plan, ParallelStyle):
        return parallelize_plan._apply(module, group)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"parallelize_plan must be a ParallelStyle or a dict of module path to "
                        f"ParallelStyle, got {type(parallelize_plan).__name__}")
    tied = _tied_keys(module)
    for key, style in parallelize_plan.items():
        if not isinstance(style, ParallelStyle):
            raise TypeError(f"parallelize_module: the plan's entry for '{key}' is a "
                            f"{type(style).__name__}, not a ParallelStyle")
        found = _matches(module, str(key).split("."), "")
        if not found:
            raise ValueError(f"parallelize_module: no submodule of {type(module).__name__} "
                             f"matches '{key}' (its children: {list(module._modules)})")
        for parent, name, path in found:
            try:
                replacement = style._apply(parent._modules[name], group)
            except (TypeError, ValueError) as exc:
                raise type(exc)(f"parallelize_module: '{path}': {exc}") from exc
            if not isinstance(replacement, Module):
                raise TypeError(f"parallelize_module: '{path}': {type(style).__name__} gave a "
                                f"{type(replacement).__name__}, not a Module")
            # in place, not by setattr (which appends): the state dict keeps the dense order
            parent._store(parent._modules, name, replacement)
    _retie(module, tied)
    return module
