"""Layers of a package and the imports between them: which arrow breaks the table.

A layer is a set of modules and the layers (or single modules) they may import. The table is a
stack: a layer names only layers above it in the table (below it in the stack), so arrows point
one way. Each module belongs to the layer with the most specific entry that holds it; an import
is allowed when the imported module is in the importer's own layer, in a layer it names, or
under a module it names. Known violations are listed with the reason, and one that no longer
occurs is reported too, so the list shrinks as the code is fixed.
"""
from __future__ import annotations

from pathlib import Path
from typing import List, NamedTuple, Optional, Sequence, Set, Tuple

from import_graph import find_modules, imports_of, within

EVERYTHING_BELOW = "everything below"
_OWN_MODULE = ".__init__"  # "a.b.__init__" in a layer: package a.b itself, not what is under it


class Layer(NamedTuple):
    name: str
    modules: Tuple[str, ...]  # each module and everything under it (see _OWN_MODULE)
    may_import: Tuple[str, ...]  # layer names, "neural_arch..." module names, EVERYTHING_BELOW


class Arrow(NamedTuple):
    """One import that its importer's layer does not allow."""
    importer: str
    imported: str
    path: str  # the importer's file, relative to the package's parent
    line: int
    rule: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.importer} -> {self.imported} ({self.rule})"


class KnownViolation(NamedTuple):
    importer: str
    imported: str  # this module and everything under it
    why: str


def layer_of(name: str, layers: Sequence[Layer]) -> Optional[Layer]:
    """The layer whose most specific entry holds the module ``name``, or None."""
    best, best_length = None, -1
    for layer in layers:
        for entry in layer.modules:
            if entry.endswith(_OWN_MODULE):
                holds = name == entry[:-len(_OWN_MODULE)]
            else:
                holds = within(name, (entry,))
            length = len(entry) if holds else -1
            if length > best_length:
                best, best_length = layer, length
    return best


def _allowed(layer: Layer, layers: Sequence[Layer], root: str) -> Tuple[Set[str], Tuple[str, ...]]:
    """(layer names, module names) that ``layer`` may import; ValueError on a table whose
    arrows do not all point down the stack."""
    position = {other.name: index for index, other in enumerate(layers)}
    below = [other.name for other in layers[:position[layer.name]]]
    names, modules = {layer.name}, []
    for entry in layer.may_import:
        if entry == EVERYTHING_BELOW:
            names.update(below)
        elif within(entry, (root,)):
            modules.append(entry)
        elif entry in below:
            names.add(entry)
        else:
            where = "above it" if entry in position else "not in the table"
            raise ValueError(f"layer {layer.name!r} may import {entry!r}, which is {where}; "
                             f"the layers below it are {below}")
    return names, tuple(modules)


def unplaced_modules(package_dir: Path, layers: Sequence[Layer]) -> List[str]:
    """The modules under ``package_dir`` that no layer holds."""
    return sorted(name for name in find_modules(package_dir) if layer_of(name, layers) is None)


def broken_arrows(package_dir: Path, layers: Sequence[Layer]) -> List[Arrow]:
    """Every import inside the package that the importer's layer does not allow, sorted."""
    modules = find_modules(package_dir)
    root = package_dir.name
    allowed = {layer.name: _allowed(layer, layers, root) for layer in layers}
    found = set()
    for module in modules.values():
        layer = layer_of(module.name, layers)
        if layer is None:
            continue  # unplaced_modules reports it
        names, allowed_modules = allowed[layer.name]
        rule = f"{layer.name} may import {', '.join(layer.may_import) or 'nothing of ours'}"
        for target, line in imports_of(module, set(modules)):
            if not within(target, (root,)) or within(target, allowed_modules):
                continue
            target_layer = layer_of(target, layers)
            if target_layer is None or target_layer.name not in names:
                path = module.path.relative_to(package_dir.parent).as_posix()
                found.add(Arrow(module.name, target, path, line, rule))
    return sorted(found)


def split_known(arrows: Sequence[Arrow], known: Sequence[KnownViolation]
                ) -> Tuple[List[Arrow], List[KnownViolation]]:
    """(the arrows no known violation covers, the known violations no arrow shows any more)."""
    def covers(violation: KnownViolation, arrow: Arrow) -> bool:
        return (arrow.importer == violation.importer
                and within(arrow.imported, (violation.imported,)))
    unexpected = [arrow for arrow in arrows if not any(covers(v, arrow) for v in known)]
    stale = [violation for violation in known if not any(covers(violation, a) for a in arrows)]
    return unexpected, stale

