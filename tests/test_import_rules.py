"""Which layer of ``neural_arch`` may import which, checked on the source with ``ast``.

The layers only stay replaceable if the arrows between them point one way: the model code
(core, nn, optim, data) must run without the distributed package, the backends must stay
array-level, and the collective algorithms must reach a transport only through its base
interface. Nothing is imported to check this: every module under ``neural_arch/`` is parsed and
every import in it resolved, including imports inside functions and
``importlib.import_module("literal")`` calls. An import names exactly one module: ``import
a.b.c`` and ``from a.b import c`` (``c`` a module) import ``a.b.c``, ``from a.b import name``
imports ``a.b``. Parent packages are not counted, or every module would import every
``__init__`` above it.
"""
from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, NamedTuple, Optional, Set, Tuple

import pytest

PACKAGE_DIR = Path(__file__).resolve().parent.parent / "neural_arch"


class Rule(NamedTuple):
    name: str
    importers: Tuple[str, ...]  # the rule holds for these modules and everything under them
    forbidden: Tuple[str, ...]  # ... which import none of these, nor anything under them,
    allowed: Tuple[str, ...] = ()  # ... except these (and what is under them)
    exempt: Tuple[str, ...] = ()  # importers the rule does not cover


_MODEL_CODE = ("neural_arch.core", "neural_arch.nn", "neural_arch.optim", "neural_arch.data")
# torch's path to DistributedDataParallel sits under nn; it leads into distributed by design,
# so nothing else of the model code may import it (and ``import neural_arch.nn`` stays free)
_DOORS = ("neural_arch.nn.parallel",)
_TRANSPORTS = "neural_arch.distributed.transports"
RULES = (
    Rule("model code runs without distributed", _MODEL_CODE, ("neural_arch.distributed",),
         exempt=_DOORS),
    Rule("model code never imports the doors to distributed", _MODEL_CODE, _DOORS,
         exempt=_DOORS),
    Rule("backends are array-level", ("neural_arch.backends",),
         ("neural_arch.core", "neural_arch.nn", "neural_arch.optim")),
    Rule("algorithms see transports only through base", ("neural_arch.distributed.algorithms",),
         (_TRANSPORTS, "neural_arch.core"), allowed=(f"{_TRANSPORTS}.base",)),
    Rule("transports know nothing above them", (_TRANSPORTS,),
         ("neural_arch.distributed.algorithms", "neural_arch.core", "neural_arch.nn")),
)


# ----- the import graph ------------------------------------------------------------------
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


def _within(name: str, prefixes: Tuple[str, ...]) -> bool:
    return any(name == prefix or name.startswith(prefix + ".") for prefix in prefixes)


def forbidden_imports(package_dir: Path, rules: Tuple[Rule, ...] = RULES) -> List[str]:
    """Every import that breaks a rule, as ``module -> imported module (rule)``, sorted."""
    modules = find_modules(package_dir)
    found = set()
    for module in modules.values():
        for target, _line in imports_of(module, set(modules)):
            for rule in rules:
                if (_within(module.name, rule.importers) and _within(target, rule.forbidden)
                        and not _within(target, rule.allowed)
                        and not _within(module.name, rule.exempt)):
                    found.add(f"{module.name} -> {target} ({rule.name})")
    return sorted(found)


# ----- the rules, on neural_arch ---------------------------------------------------------
def test_no_module_imports_across_a_forbidden_arrow():
    found = forbidden_imports(PACKAGE_DIR)
    assert not found, f"{len(found)} forbidden imports:\n  " + "\n  ".join(found)


def test_the_checker_sees_the_real_imports():
    # guards the test above against passing on an empty or misread tree
    modules = find_modules(PACKAGE_DIR)
    fused = modules["neural_arch.core.fused_kernels"]
    targets = {target for target, _ in imports_of(fused, set(modules))}
    assert {"neural_arch.backends.kernels.dispatch", "neural_arch.core.tensor"} <= targets, targets
    assert len(modules) > 100, sorted(modules)


def test_importing_the_model_code_and_torch_paths_loads_no_distributed():
    # the rules above, at run time: torch's paths other than nn.parallel stay light too
    code = ("import sys, neural_arch, neural_arch.nn, neural_arch.nn.functional, "
            "neural_arch.optim, neural_arch.data, neural_arch.models, neural_arch.utils.data, "
            "neural_arch.nn.parallel\n"
            "print(sorted(m for m in sys.modules if m.startswith('neural_arch.distributed')))")
    env = dict(os.environ, PYTHONPATH=str(PACKAGE_DIR.parent))
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]", result.stdout


# ----- the checker, on a package made to break the rules ---------------------------------
_SYNTHETIC = {
    "__init__.py": "",
    "core/__init__.py": "",
    "core/engine.py": """
import numpy
from . import helpers
from ..backends import arrays

def late():
    from ..distributed import comm
    return comm
""",
    "core/helpers.py": "",
    "nn/__init__.py": "",
    "nn/layer.py": "import neural_arch.distributed.comm as comm\n",
    "nn/parallel.py": """
import importlib

def __getattr__(name):
    return importlib.import_module("neural_arch.distributed.comm")
""",
    "nn/wrapper.py": "from .parallel import DistributedDataParallel\n",
    "backends/__init__.py": "from .. import core\n",
    "backends/arrays.py": """
import importlib

def engine():
    return importlib.import_module(".engine", package="neural_arch.core")
""",
    "distributed/__init__.py": "",
    "distributed/comm.py": "",
    "distributed/transports/__init__.py": """
import importlib
RING = importlib.import_module("..algorithms.ring", __name__)
""",
    "distributed/transports/base.py": "class Transport: pass\n",
    "distributed/transports/shm.py": "from ..algorithms import ring\nfrom .base import Transport\n",
    "distributed/algorithms/__init__.py": "",
    "distributed/algorithms/ring.py": """
from ..transports.base import Transport
from ..transports import base

def pick():
    from ..transports import shm
    from .. import transports
    return shm, transports
""",
    "distributed/algorithms/tree.py": """
from importlib import import_module
from neural_arch.distributed.transports.base import Transport
SHM = import_module("neural_arch.distributed.transports.shm")
""",
}


def _write_package(root: Path, files: Dict[str, str]) -> Path:
    for relative, text in files.items():
        path = root / "neural_arch" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"), encoding="utf-8")
    return root / "neural_arch"


def test_the_checker_reports_every_forbidden_arrow(tmp_path):
    found = forbidden_imports(_write_package(tmp_path, _SYNTHETIC))
    model, doors, arrays, algorithms, transports = (f" ({rule.name})" for rule in RULES)
    assert found == sorted([
        "neural_arch.core.engine -> neural_arch.distributed.comm" + model,
        "neural_arch.nn.layer -> neural_arch.distributed.comm" + model,
        "neural_arch.nn.wrapper -> neural_arch.nn.parallel" + doors,
        "neural_arch.backends -> neural_arch.core" + arrays,
        "neural_arch.backends.arrays -> neural_arch.core.engine" + arrays,
        "neural_arch.distributed.algorithms.ring -> neural_arch.distributed.transports"
        + algorithms,
        "neural_arch.distributed.algorithms.ring -> neural_arch.distributed.transports.shm"
        + algorithms,
        "neural_arch.distributed.algorithms.tree -> neural_arch.distributed.transports.shm"
        + algorithms,
        "neural_arch.distributed.transports -> neural_arch.distributed.algorithms.ring"
        + transports,
        "neural_arch.distributed.transports.shm -> neural_arch.distributed.algorithms.ring"
        + transports,
    ]), "\n".join(found)


def test_a_relative_import_above_the_top_package_is_an_error(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "",
                                        "core.py": "from ...outside import x\n"})
    with pytest.raises(ValueError, match=r"core.py:1: relative import \.\.\.outside goes above "
                                         r"the top package \(resolved against 'neural_arch'\)"):
        forbidden_imports(package)
