"""The files each cached Numba kernel module of ``neural_arch.backends`` is built from.

Numba's cache stamps a kernel by its own file only, so a kernel module that imports another
module of ours (a compiled function inlined or called, a constant frozen into the machine code,
the njit options of ``numba_backend``) declares ``BUILT_FROM``: those modules, everything their
own ``BUILT_FROM`` holds, and itself. ``numba_backend`` drops a module's cached machine code
before its first kernel compiles when one of them changed (``compiled_cache``). Read here from
the code with ``ast``: nothing is imported and Numba is not needed. Also: a changed dependency
reaches every kernel and helper of a module, and an unchanged one is loaded from the cache; a
process whose files changed after it imported them caches nothing; the kernels are usable only
once the modules they are built from are refreshed too.
"""
from __future__ import annotations

import ast
import importlib
import os
import sys
from pathlib import Path

import pytest

from import_graph import find_modules, imports_of
from neural_arch.backends import compiled_cache, numba_backend

pytestmark = pytest.mark.timeout(60)

BACKENDS_DIR = Path(numba_backend.__file__).resolve().parent
PACKAGE = "neural_arch.backends"
TOP = "neural_arch"
# modules with Numba kernels whose guard lives elsewhere (tests/distributed/transports/shm)
GUARDED_ELSEWHERE = ("neural_arch.distributed.transports.shm",)


def _is_kernel_module(module) -> bool:
    """Whether ``module`` defines cached Numba functions (directly or through the decorators
    of ``numba_backend``, which always cache)."""
    if module.name in (f"{PACKAGE}.numba_backend", f"{PACKAGE}.compiled_cache"):
        return False
    text = module.path.read_text(encoding="utf-8")
    return "cache=True" in text or (
        "numba_backend import" in text and any(f"@{d}" in text
                                               for d in ("compiled", "helper", "inlined")))


def _our_imports(module, known) -> set:
    return {target for target, _ in imports_of(module, known)
            if target != module.name and (target == TOP or target.startswith(TOP + "."))}


def _declared_built_from(path: Path):
    """The literal module-level ``BUILT_FROM`` of the file at ``path``, or None."""
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "BUILT_FROM" for t in node.targets):
            return tuple(ast.literal_eval(node.value))
    return None


def _set_after_a_function(path: Path) -> bool:
    """Whether ``BUILT_FROM`` is assigned after the first function of the file at ``path``
    (its files are hashed as the first kernel is defined, while the module is imported)."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    first_function = next((n.lineno for n in body if isinstance(n, ast.FunctionDef)), None)
    return any(isinstance(n, ast.Assign) and first_function is not None
               and n.lineno > first_function
               and any(isinstance(t, ast.Name) and t.id == "BUILT_FROM" for t in n.targets)
               for n in body)


def _relative(name: str) -> str:
    """A dotted module name as ``BUILT_FROM`` writes it: relative to the backends package."""
    return name[len(PACKAGE) + 1:] if name.startswith(PACKAGE + ".") else name


def test_every_cached_kernel_module_lists_what_it_is_built_from():
    modules = find_modules(BACKENDS_DIR.parents[0])
    known = set(modules)
    kernel_modules = {name: m for name, m in modules.items()
                      if name.startswith(PACKAGE + ".") and _is_kernel_module(m)}
    assert {f"{PACKAGE}.erf_kernels", f"{PACKAGE}.norm_softmax_kernels"} <= set(kernel_modules)
    declared = {_relative(name): _declared_built_from(m.path) for name, m in modules.items()
                if name.startswith(PACKAGE + ".")}
    problems = {}
    for name, module in sorted(kernel_modules.items()):
        short = _relative(name)
        imported = {_relative(target) for target in _our_imports(module, known)}
        outside = sorted(i for i in imported if i.startswith(TOP))
        if outside:  # BUILT_FROM names modules of the backends package only
            problems[short] = f"imports modules outside {PACKAGE}: {outside}"
            continue
        if not imported:
            continue  # its own file is all it is built from: Numba's stamp covers it
        listed = declared.get(short)
        if listed is None:
            problems[short] = f"no literal BUILT_FROM; it imports {sorted(imported)}"
            continue
        needed = {short} | imported
        for other in imported:
            needed |= set(declared.get(other) or ())
        missing = sorted(needed - set(listed))
        absent = [n for n in listed
                  if not BACKENDS_DIR.joinpath(*n.split(".")).with_suffix(".py").is_file()]
        if missing or absent:
            problems[short] = f"BUILT_FROM lacks {missing}; names no file: {absent}"
        elif _set_after_a_function(module.path):
            problems[short] = "BUILT_FROM is set after its first function"
    assert not problems, f"cached kernel modules whose BUILT_FROM is not complete: {problems}"


def test_no_other_cached_kernel_module_reads_another_of_our_modules():
    """Elsewhere in the package a cached kernel module must be self-contained (its own file is
    all Numba's cache needs to stamp), or get a guard of its own."""
    modules = find_modules(BACKENDS_DIR.parents[0])
    known = set(modules)
    dependent = {
        name: sorted(_our_imports(m, known)) for name, m in modules.items()
        if not name.startswith((PACKAGE + ".", *GUARDED_ELSEWHERE)) and _is_kernel_module(m)
        and _our_imports(m, known)}
    assert not dependent, f"cached Numba kernels built from other modules, unguarded: {dependent}"


# ----- the guard at work: modules in a temporary folder, as an in-place upgrade leaves them
def _kernel_module(header: str, *kernels: tuple, built_from: tuple = ()) -> str:
    """The text of a throwaway kernel module: ``header`` (its constant, its import of the other
    module), ``BUILT_FROM`` where given, then each kernel ``(decorator, name, what it returns)``
    as a function of ``x``."""
    lines = ["from neural_arch.backends.numba_backend import compiled, helper", header]
    if built_from:
        lines.append(f"BUILT_FROM = {built_from!r}")
    for decorator, name, returned in kernels:
        lines += ["", "", f"@{decorator}", f"def {name}(x):", f"    return {returned}"]
    return "\n".join(lines) + "\n"


def _dep(offset: int) -> str:
    """``dep``: the constant OFFSET and a helper reading it, no ``BUILT_FROM`` of its own."""
    return _kernel_module(f"OFFSET = {offset}", ("helper", "shifted", "x + OFFSET"))


CALLER = _kernel_module(
    "from dep import OFFSET, shifted",
    ("helper", "_scaled", "x * OFFSET"),  # a helper of the caller's own reading dep's constant
    ("compiled", "scaled", "_scaled(x)"),
    ("compiled", "shifted_twice", "shifted(shifted(x))"),
    built_from=("caller", "dep"))


def _fresh_import(folder: Path):
    """``caller`` imported as a new process would: new modules, new dispatchers, each group
    checked again; the machine code comes from the cache on disk."""
    for name in ("caller", "dep"):
        sys.modules.pop(name, None)
    compiled_cache.forget()
    importlib.invalidate_caches()
    return importlib.import_module("caller")


@pytest.fixture
def upgraded_modules(tmp_path):
    if not numba_backend.is_available():
        pytest.skip(numba_backend.unavailable_reason())
    (tmp_path / "dep.py").write_text(_dep(1))
    (tmp_path / "caller.py").write_text(CALLER)
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in ("caller", "dep"):
        sys.modules.pop(name, None)
    compiled_cache.forget()


def test_a_changed_dependency_reaches_every_kernel_of_the_module(upgraded_modules):
    caller = _fresh_import(upgraded_modules)
    assert (caller.scaled(2), caller.shifted_twice(2)) == (2, 4)  # compiled and cached
    (upgraded_modules / "dep.py").write_text(_dep(10))  # caller.py stays as it was
    caller = _fresh_import(upgraded_modules)
    # the first kernel called refreshes the whole module: the second one and the helper too
    assert (caller.scaled(2), caller.shifted_twice(2)) == (20, 22), (
        "Numba's cache still ran the old OFFSET 1 frozen into caller's machine code")
    caller = _fresh_import(upgraded_modules)  # the normal path: loaded from the cache
    assert (caller.scaled(3), caller.shifted_twice(3)) == (30, 23)
    assert all(sum(kernel._compiled.stats.cache_hits.values()) == 1
               for kernel in (caller.scaled, caller.shifted_twice))


def test_the_kernel_modules_record_the_digest_of_what_they_are_built_from():
    """A softmax kernel's first call checks its module and the module it inlines from."""
    if not numba_backend.is_available():
        pytest.skip(numba_backend.unavailable_reason())
    import numpy as np

    from neural_arch.backends import erf_kernels, norm_softmax_kernels
    norm_softmax_kernels.softmax(np.zeros((2, 3), np.float32), None)
    for module in (norm_softmax_kernels, erf_kernels):  # erf's too, though none of its ran
        folder = compiled_cache.module_dispatchers(module)[0].stats.cache_path
        if not folder or not os.access(folder, os.W_OK):
            continue  # no cache, nothing recorded
        paths = [str(BACKENDS_DIR / f"{name}.py") for name in module.BUILT_FROM]
        stamp = Path(folder) / f"{module.__name__}{compiled_cache.SUFFIX}"
        assert stamp.read_text().strip() == compiled_cache.sources_digest(paths), stamp


def test_code_imported_before_its_files_changed_is_not_cached_as_the_new(upgraded_modules):
    caller = _fresh_import(upgraded_modules)  # the old code, imported; no kernel has run
    (upgraded_modules / "dep.py").write_text(_dep(10))
    assert caller.scaled(2) == 2  # this process runs the OFFSET 1 it imported
    caller = _fresh_import(upgraded_modules)
    assert caller.scaled(2) == 20, (
        "the first call cached the old OFFSET 1 under the digest of the new files")


# each module a group of its own, the caller's built from the other's too
ORDERED_DEP = _kernel_module("OFFSET = 3", ("compiled", "shifted", "x + OFFSET"),
                             built_from=("ordered_dep",))
ORDERED_CALLER = _kernel_module("from ordered_dep import OFFSET",
                                ("compiled", "scaled", "x * OFFSET"),
                                built_from=("ordered_caller", "ordered_dep"))


def test_kernels_are_published_after_every_module_they_are_built_from_is_refreshed(
        upgraded_modules, monkeypatch):
    """Other threads call a kernel's compiled form without the lock: it must not be set while a
    module it is built from is not yet refreshed (its stale cache could then be loaded)."""
    for name, text in (("ordered_dep", ORDERED_DEP), ("ordered_caller", ORDERED_CALLER)):
        (upgraded_modules / f"{name}.py").write_text(text)
        monkeypatch.delitem(sys.modules, name, raising=False)
    caller = importlib.import_module("ordered_caller")
    kernels = (caller.scaled, sys.modules["ordered_dep"].shifted)
    calls, refresh = [], compiled_cache.refresh_if_stale

    def watched(dispatchers, sources, name):
        calls.append((name, [kernel._compiled is not None for kernel in kernels]))
        return refresh(dispatchers, sources, name)

    monkeypatch.setattr(compiled_cache, "refresh_if_stale", watched)
    try:
        assert caller.scaled(2) == 6
    finally:
        for name in ("ordered_dep", "ordered_caller"):
            sys.modules.pop(name, None)
    assert calls == [("ordered_dep", [False, False]), ("ordered_caller", [False, False])], (
        "refreshed in this order, with these kernels (scaled, shifted) already published")
    assert all(kernel._compiled is not None for kernel in kernels)
