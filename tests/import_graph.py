"""The import graph of a package, read from its source with ``ast`` (nothing is imported).

Every import is found, at any depth of a module's code (inside functions, methods and ``if``
blocks too), and so are ``importlib.import_module("literal")`` calls. An import names exactly
one module: ``import a.b.c`` and ``from a.b import c`` (``c`` a module) import ``a.b.c``,
``from a.b import name`` imports ``a.b``. Parent packages are not counted, or every module would
import every ``__init__`` above it. ``tests/import_layers.py`` checks the graph against a table
of layers.
"""
from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, NamedTuple, Optional, Set, Tuple


class Module(NamedTuple):
    name: str
    path: Path
    is_package: bool  # an __init__.py: relative imports resolve against the module itself


def find_modules(package_dir: Path) -> Dict[str, Module]:
    """Every ``.py`` module under ``package_dir``, by dotted name."""
    modules = {}
    for path in sorted(package_dir.rglob("*.py")):
        parts = path.relative_to(package_dir.parent).with_suffix("").parts
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        modules[name] = Module(name, path, is_package)
    return modules


def absolute_name(name: str, level: int, package: str, where: str) -> str:
    """``name`` with ``level`` leading dots, resolved against ``package`` as Python does."""
    if level == 0:
        return name
    parts = package.split(".") if package else []
    if level > len(parts):
        raise ValueError(f"{where}: relative import {'.' * level}{name} goes above the top "
                         f"package (resolved against {package!r})")
    base = ".".join(parts[:len(parts) - (level - 1)])
    return f"{base}.{name}" if name else base


def _import_module_target(call: ast.Call, module: Module, where: str) -> Optional[str]:
    """The module an ``importlib.import_module`` call names, when its arguments say it."""
    func = call.func
    is_import_module = (isinstance(func, ast.Name) and func.id == "import_module") or (
        isinstance(func, ast.Attribute) and func.attr == "import_module"
        and isinstance(func.value, ast.Name) and func.value.id == "importlib")
    if not is_import_module or not call.args:
        return None
    first = call.args[0]
    if not (isinstance(first, ast.Constant) and isinstance(first.value, str)):
        return None  # a computed name: nothing to read from the source
    target = first.value
    level = len(target) - len(target.lstrip("."))
    if level == 0:
        return target
    package_arg = call.args[1] if len(call.args) > 1 else next(
        (kw.value for kw in call.keywords if kw.arg == "package"), None)
    if isinstance(package_arg, ast.Constant) and isinstance(package_arg.value, str):
        package = package_arg.value
    elif isinstance(package_arg, ast.Name) and package_arg.id == "__name__":
        package = module.name
    else:
        return None
    return absolute_name(target[level:], level, package, where)


def imports_of(module: Module, known: Set[str]) -> Iterator[Tuple[str, int]]:
    """(imported module, line) for every import in ``module``, at any depth of its code."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"), filename=str(module.path))
    package = module.name if module.is_package else module.name.rpartition(".")[0]
    for node in ast.walk(tree):
        where = f"{module.path}:{getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = absolute_name(node.module or "", node.level, package, where)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"
                yield (submodule if submodule in known else base), node.lineno
        elif isinstance(node, ast.Call):
            target = _import_module_target(node, module, where)
            if target is not None:
                yield target, node.lineno


def within(name: str, prefixes: Tuple[str, ...]) -> bool:
    """Whether ``name`` is one of ``prefixes`` or a module under one of them."""
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)
