"""The CUDA sources compile, and the Python side agrees with what they define.

Every ``.cu`` file is compiled to PTX with ``nvcc -ptx -arch=sm_90`` twice: as the file (its
``#include`` resolved by nvcc) and as the inlined text CuPy compiles (which must stand alone).
The PTX entry points and their parameter types must match the kernel table the wrappers launch
through, and every kernel the wrappers name must exist. No GPU is needed.
"""
from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from neural_arch.backends import kernels
from neural_arch.backends.kernels import KERNELS, PTX_TYPES

pytestmark = pytest.mark.timeout(300)

_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((.*?)\)", re.DOTALL)
_PARAM = re.compile(r"\.param\s+\.(\w+)")
_WRAPPERS = Path(kernels.__file__).resolve().parent.parent / "cupy_kernels.py"


def _nvcc() -> str:
    for candidate in (shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    pytest.skip("nvcc not found")


def _compile(source: Path, out_dir: Path) -> str:
    ptx = out_dir / (source.stem + ".ptx")
    result = subprocess.run([_nvcc(), "-ptx", "-arch=sm_90", "-Werror", "all-warnings",
                             str(source), "-o", str(ptx)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"nvcc failed on {source.name}:\n{result.stderr}"
    return ptx.read_text()


def _entries(ptx: str) -> dict:
    """{kernel name: [PTX parameter types]} of every entry point."""
    return {name: _PARAM.findall(params) for name, params in _ENTRY.findall(ptx)}


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict:
    """{source file name: (entries of the file, entries of the inlined text)}."""
    files = kernels.source_files()
    assert files, "no .cu sources in the kernels package"
    out = tmp_path_factory.mktemp("ptx")
    results = {}
    for path in files:
        inlined = out / "inlined" / path.name
        inlined.parent.mkdir(exist_ok=True)
        inlined.write_text(kernels.source(path.name))
        results[path.name] = (_entries(_compile(path, out)),
                              _entries(_compile(inlined, inlined.parent)))
    return results


def test_every_source_compiles_alone_and_inlined(compiled):
    for name, (as_file, inlined) in compiled.items():
        assert as_file, f"{name} defines no kernel"
        assert as_file == inlined, f"{name}: the inlined text compiles to different kernels"


def test_kernel_table_matches_the_ptx(compiled):
    for name, kernel in KERNELS.items():
        entries = compiled[kernel.source][0]
        assert name in entries, f"{name} is not an entry point of {kernel.source}"
        expected = [PTX_TYPES[kind] for kind in kernel.params]
        assert entries[name] == expected, (f"{name}: PTX parameters {entries[name]} but the "
                                           f"table says {expected} ({kernel.params})")


def test_every_ptx_kernel_is_in_the_table(compiled):
    for source, (entries, _) in compiled.items():
        missing = sorted(set(entries) - set(KERNELS))
        assert not missing, f"{source} defines kernels the table does not list: {missing}"


def _launched_names() -> set:
    """Kernel names the wrappers pass to ``launch`` or keep in their ``*_KERNELS`` tables."""
    tree = ast.parse(_WRAPPERS.read_text())
    names = set()
    for node in ast.walk(tree):
        function = getattr(node, "func", None)  # launch(...), or gpu.launch(...) in a module
        called = getattr(function, "id", None) or getattr(function, "attr", None)
        if (isinstance(node, ast.Call) and called == "launch"
                and node.args and isinstance(node.args[0], ast.Constant)):
            names.add(node.args[0].value)
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict)
                and any(getattr(t, "id", "").endswith("_KERNELS") for t in node.targets)):
            names.update(v.value for v in node.value.values if isinstance(v, ast.Constant))
    return names


def test_wrappers_launch_only_kernels_that_exist(compiled):
    launched = _launched_names()
    defined = {name for entries, _ in compiled.values() for name in entries}
    assert launched, "found no launch(...) calls in cupy_kernels.py"
    assert launched <= defined, f"wrappers name kernels no source defines: {launched - defined}"
    assert launched == set(KERNELS), f"table kernels no wrapper launches: {set(KERNELS) - launched}"


def test_inlining_replaces_includes_and_rejects_unknown_sources():
    text = kernels.source("cross_entropy.cu")
    assert "#include" not in text and "nf_block_sum" in text and "pragma once" not in text
    with pytest.raises(ValueError, match="no kernel source 'missing.cu'"):
        kernels.source("missing.cu")
    with pytest.raises(ValueError, match="no kernel source"):
        kernels.source("../cupy_kernels.py")
