"""Import modules in a fresh interpreter where the optional packages are absent.

The optional packages (numba, mpi4py, CuPy, torch, ...) are installed on a development
machine, so importing there proves nothing about a plain ``pip install``. The probe makes each
blocked package look uninstalled: a ``None`` entry in ``sys.modules`` answers ``import`` and
``importlib.util.find_spec`` as for an absent package, and a meta-path finder refuses the name
should that entry be dropped. Which packages are optional is read from ``setup.py``: a package
``install_requires`` declares is a core dependency and stays importable.
"""
from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Dict, List, NamedTuple, Sequence, Tuple

# import name -> the distribution that provides it
THIRD_PARTY = {"numba": "numba", "mpi4py": "mpi4py", "cupy": "cupy-cuda12x", "torch": "torch",
               "safetensors": "safetensors", "tqdm": "tqdm", "tensorboardX": "tensorboardX",
               "matplotlib": "matplotlib", "sklearn": "scikit-learn", "optuna": "optuna",
               "mlflow": "mlflow-skinny", "ml_dtypes": "ml_dtypes"}

_PROBE = r'''
import importlib, importlib.abc, json, sys, traceback
blocked, modules, watched = json.loads(sys.argv[1])

class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in blocked:
            raise ModuleNotFoundError(f"No module named {name!r} (blocked)", name=name)
        return None

sys.meta_path.insert(0, Absent())
for name in blocked:
    sys.modules[name] = None
report = {"modules": {}, "still_importable": []}
for name in modules:
    try:
        importlib.import_module(name)
        error = None
    except Exception:
        error = traceback.format_exc(limit=-3)
    loaded = sorted(m for m in sys.modules if m == watched or m.startswith(watched + "."))
    report["modules"][name] = {"error": error, "watched_loaded": loaded}
for name in blocked:
    try:
        importlib.import_module(name)
        report["still_importable"].append(name)
    except ImportError:
        pass
print(json.dumps(report))
'''


class Imported(NamedTuple):
    error: str  # the traceback's end, "" when the import succeeded
    watched_loaded: Tuple[str, ...]  # modules under the watched prefix loaded by then


def required_distributions(setup_py: Path) -> List[str]:
    """The distribution names (lower case, no versions) of ``install_requires`` in setup.py."""
    tree = ast.parse(setup_py.read_text(encoding="utf-8"), filename=str(setup_py))
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "install_requires":
            requirements = ast.literal_eval(node.value)
            return sorted(re.split(r"[\s<>=!~;\[]", r, maxsplit=1)[0].lower()
                          for r in requirements)
    raise ValueError(f"{setup_py}: no install_requires=[...] literal in the setup() call")


def optional_packages(setup_py: Path) -> List[str]:
    """The import names of THIRD_PARTY whose distribution setup.py does not require."""
    required = set(required_distributions(setup_py))
    return sorted(name for name, dist in THIRD_PARTY.items() if dist.lower() not in required)


def probe_imports(modules: Sequence[str], blocked: Sequence[str], search_path: Path,
                  watched: str, timeout: float = 60.0) -> Dict[str, Imported]:
    """Import ``modules`` in order, in one fresh interpreter that finds ``search_path`` first
    and where ``blocked`` packages are absent; RuntimeError when the probe itself fails or
    a blocked package could still be imported."""
    env = dict(os.environ, PYTHONPATH=str(search_path))
    argument = json.dumps([list(blocked), list(modules), watched])
    result = subprocess.run([sys.executable, "-c", _PROBE, argument], capture_output=True,
                            text=True, env=env, timeout=timeout, cwd=str(search_path))
    if result.returncode != 0:
        raise RuntimeError(f"import probe of {list(modules)} exited with {result.returncode}:\n"
                           f"{result.stderr[-3000:]}")
    report = json.loads(result.stdout.strip().splitlines()[-1])
    if report["still_importable"]:
        raise RuntimeError(f"import probe: blocked packages {report['still_importable']} "
                           "could still be imported")
    return {name: Imported(entry["error"] or "", tuple(entry["watched_loaded"]))
            for name, entry in report["modules"].items()}
