"""The files each cached shm kernel module is built from (``kernel_sources.BUILT_FROM``), read
from the code: a kernel module that imports another module of ours (its compiled functions or
its constants, both frozen into the cached machine code) must list it, and everything that
module's own machine code is built from, or a change there would leave Numba's cache stale.
Also: once the compiled kernels are loaded, their recorded digests match the files."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from import_graph import find_modules, imports_of
from neural_arch.backends import compiled_cache
from neural_arch.distributed.transports.shm import compiled, kernel_sources

pytestmark = pytest.mark.timeout(60)

SHM_DIR = Path(kernel_sources.__file__).resolve().parent
PACKAGE = "neural_arch.distributed.transports.shm"


def _cached_kernel_imports():
    """{short name: short names of the package modules it imports} of each module with cached
    Numba kernels, read with ``ast`` (the package's ``__init__`` itself left out)."""
    modules = find_modules(SHM_DIR.parents[2])
    found = {}
    for name, module in modules.items():
        if name.startswith(PACKAGE + ".") and "cache=True" in module.path.read_text():
            imported = {target for target, _ in imports_of(module, set(modules))}
            found[name.rpartition(".")[2]] = {
                target.rpartition(".")[2] for target in imported
                if target.startswith(PACKAGE + ".")}
    return found


def test_every_cached_kernel_module_lists_what_it_is_built_from():
    kernel_imports = _cached_kernel_imports()
    assert {"kernels", "entry_kernels", "pair_kernels"} <= set(kernel_imports)
    missing = {}
    for name, imported in sorted(kernel_imports.items()):
        if not imported:
            assert name not in kernel_sources.BUILT_FROM or kernel_sources.BUILT_FROM[name]
            continue
        needed = {name} | imported
        for other in imported:
            needed |= set(kernel_sources.BUILT_FROM.get(other, ()))
        listed = set(kernel_sources.BUILT_FROM.get(name, ()))
        if not needed <= listed:
            missing[name] = sorted(needed - listed)
    assert not missing, f"kernel_sources.BUILT_FROM lacks these files of each module: {missing}"


@pytest.mark.skipif(not compiled.allowed(), reason="Numba is not installed or switched off")
def test_loaded_kernels_have_recorded_the_digest_of_their_sources():
    if compiled._kernels() is None:
        pytest.skip(compiled.why_not_compiled())
    from neural_arch.distributed.transports.shm import kernels
    for name in ("kernels", "entry_kernels"):
        module = kernels if name == "kernels" else compiled._built["entry"]
        folder = compiled_cache.module_dispatchers(module)[0].stats.cache_path
        if not folder or not os.access(folder, os.W_OK):
            continue  # no cache, nothing recorded
        paths = [str(SHM_DIR / f"{source}.py") for source in kernel_sources.BUILT_FROM[name]]
        stamp = Path(folder) / f"{module.__name__}{compiled_cache.SUFFIX}"
        assert stamp.read_text().strip() == compiled_cache.sources_digest(paths), stamp
