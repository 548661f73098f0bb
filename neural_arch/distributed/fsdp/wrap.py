"""Which submodules become units of their own, and which unit owns each parameter.

A policy has torch's signature ``policy(module, recurse, nonwrapped_numel) -> bool``: asked
with ``recurse=True`` whether to look inside ``module``, with ``recurse=False`` whether to make
it a unit (``nonwrapped_numel`` counts its parameters not yet claimed by a unit below it).
``functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})`` and
``ModuleWrapPolicy({Block})`` make each ``Block`` a unit; ``size_based_auto_wrap_policy``
makes units of subtrees with at least ``min_num_params`` parameters.

Units are found bottom-up as torch does; the wrapped module itself is always the root unit,
holding every parameter no other unit claimed. A parameter registered by several modules
(tied weights) belongs to the innermost unit that contains all of them, so a unit never
computes with a parameter another unit owns.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from ...nn import Module

Policy = Callable[..., bool]


def transformer_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int,
                                 transformer_layer_cls: Iterable[type]) -> bool:
    """Every instance of ``transformer_layer_cls`` (a set of classes) is a unit."""
    if recurse:
        return True
    return isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(module: Module, recurse: bool, nonwrapped_numel: int,
                                min_num_params: int = int(1e8)) -> bool:
    """A subtree with at least ``min_num_params`` parameters not in a smaller unit is a unit."""
    return nonwrapped_numel >= min_num_params


class ModuleWrapPolicy:
    """Every instance of one of ``module_classes`` is a unit (torch's ``ModuleWrapPolicy``)."""

    def __init__(self, module_classes: Iterable[type]) -> None:
        self.module_classes = tuple(module_classes)

    def __call__(self, module: Module, recurse: bool, nonwrapped_numel: int) -> bool:
        return recurse or isinstance(module, self.module_classes)


def _policy(value: Any) -> Optional[Policy]:
    """A callable policy; a set/list/tuple of classes means ``ModuleWrapPolicy`` of them."""
    if value is None or callable(value):
        return value
    if isinstance(value, (set, frozenset, list, tuple)) and all(isinstance(c, type) for c in value):
        return ModuleWrapPolicy(value)
    raise TypeError(f"FullyShardedDataParallel: auto_wrap_policy must be callable or a set of "
                    f"module classes, got {value!r}")


def _numel(module: Module, claimed: Set[int]) -> int:
    return sum(p.array.size for p in module.parameters() if id(p) not in claimed)


def unit_prefixes(module: Module, auto_wrap_policy: Any) -> List[str]:
    """Dotted names of the modules that are units, the root ``""`` first, then the others in
    the order their modules are registered (depth first)."""
    policy = _policy(auto_wrap_policy)
    if policy is None:
        return [""]
    chosen: List[str] = []
    claimed: Set[int] = set()

    def visit(prefix: str, node: Module, is_root: bool) -> None:
        if not policy(module=node, recurse=True, nonwrapped_numel=_numel(node, claimed)):
            return
        for name, child in node.named_children():
            visit(f"{prefix}.{name}" if prefix else name, child, False)
        if not is_root and policy(module=node, recurse=False,
                                  nonwrapped_numel=_numel(node, claimed)):
            chosen.append(prefix)
            claimed.update(id(p) for p in node.parameters())

    visit("", module, True)
    order = {name: i for i, (name, _) in enumerate(module.named_modules())}
    return [""] + sorted(chosen, key=order.__getitem__)


def _contains(unit: str, module_name: str) -> bool:
    return unit == "" or module_name == unit or module_name.startswith(unit + ".")


def assign_parameters(module: Module, prefixes: List[str]) -> Dict[str, List[Tuple[str, Any]]]:
    """Unit prefix -> its (fully qualified name, parameter) pairs, in registration order. Only
    parameters that require grad are sharded; frozen ones stay whole on every rank."""
    owners: Dict[int, List[str]] = {}
    for name, sub in module.named_modules():
        for local, param in sub.named_parameters(recurse=False):
            owners.setdefault(id(param), []).append(name)
    deepest_first = sorted(prefixes, key=lambda p: -len(p.split("."))
                           if p else 0)
    units: Dict[str, List[Tuple[str, Any]]] = {p: [] for p in prefixes}
    for fqn, param in module.named_parameters():
        if not param.requires_grad:
            continue
        names = owners[id(param)]
        unit = next(p for p in deepest_first if all(_contains(p, n) for n in names))
        units[unit].append((fqn, param))
    return units
