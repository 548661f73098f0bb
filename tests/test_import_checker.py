"""The import-rule checker fails where it should: the real layer table of
``test_import_rules.py`` on a small package made to break each rule, with imports at the top
of a module, inside functions and through ``importlib.import_module``; and the import probe on
a package that needs an optional package or loads its distributed part too early."""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict

import pytest

from import_layers import KnownViolation, Layer, broken_arrows, split_known, unplaced_modules
from import_probe import probe_imports, required_distributions
from test_import_rules import LAYERS

pytestmark = pytest.mark.timeout(60)

_D = "distributed"
# one allowed and one forbidden arrow per rule; "# breaks" marks every forbidden one
_SYNTHETIC = {
    "__init__.py": "from . import core, serialization\n",
    "_lazy.py": "",
    "backends/__init__.py": "from .. import _lazy\n",
    "backends/arrays.py": """
import importlib

def engine():
    return importlib.import_module(".engine", package="neural_arch.core")  # breaks
""",
    "core/__init__.py": "from ..backends import arrays\n",
    "core/engine.py": "from neural_arch.nn import layer  # breaks\n",
    "nn/__init__.py": "from ..core import engine\n",
    "nn/layer.py": "from .parallel import DistributedDataParallel  # breaks\n",
    "nn/parallel.py": "from ..distributed.ddp import DistributedDataParallel\n",
    "models/__init__.py": "",
    "models/gpt.py": """
from ..nn import layer

def split(group):
    from ..distributed.tensor_parallel import gpt  # breaks
    return gpt
""",
    "utils/__init__.py": "",
    "utils/checkpoint.py": "import neural_arch.distributed.ddp.sampler  # breaks\n",
    "utils/data/__init__.py": "",
    "utils/data/distributed.py": "from ...distributed.ddp.sampler import DistributedSampler\n",
    "serialization/__init__.py": """
def save():
    from ..distributed.checkpoint import owner
    from ..distributed.checkpoint import sharded  # breaks
""",
    f"{_D}/__init__.py": "from . import collectives\n",
    f"{_D}/errors.py": "",
    f"{_D}/processes.py": "from .errors import DistributedError\nfrom . import group  # breaks\n",
    f"{_D}/rendezvous/__init__.py": "",
    f"{_D}/rendezvous/store.py": ("from ..errors import StoreError\n"
                                  "from ..health import heartbeat  # breaks\n"),
    f"{_D}/health/__init__.py": "",
    f"{_D}/health/heartbeat.py": """
from ..rendezvous import store
from ..transports.base import Transport

def watch():
    from ..transports import tcp  # breaks
""",
    f"{_D}/health/preemption.py": "from ..group import world\nfrom .. import collectives\n",
    f"{_D}/transports/__init__.py": "",
    f"{_D}/transports/base.py": "from ..errors import DistributedError\n",
    f"{_D}/transports/tcp.py": """
from ..health import heartbeat
from ..rendezvous import store
from ..algorithms import ring  # breaks
""",
    f"{_D}/transports/shm.py": ("import importlib\n"
                                "W = importlib.import_module('...group.world',"
                                " __name__)  # breaks\n"),
    f"{_D}/algorithms/__init__.py": "",
    f"{_D}/algorithms/ring.py": """
from ..transports.base import Transport

def pick():
    from ..transports import tcp  # breaks
    from .. import transports  # breaks
""",
    f"{_D}/group/__init__.py": "",
    f"{_D}/group/world.py": """
from ..transports import tcp
from ..algorithms import ring
from ..health import heartbeat

def new_group():
    from ..collectives import all_reduce  # breaks
""",
    f"{_D}/collectives.py": "from .group import world\nfrom .ddp import sampler  # breaks\n",
    f"{_D}/ddp/__init__.py": "from ...nn import layer\nfrom ... import horovod  # breaks\n",
    f"{_D}/ddp/sampler.py": "",
    f"{_D}/checkpoint/__init__.py": "",
    f"{_D}/checkpoint/owner.py": "",
    f"{_D}/checkpoint/sharded.py": "",
    f"{_D}/tensor_parallel/__init__.py": "",
    f"{_D}/tensor_parallel/gpt.py": "from ...models import gpt\n",
    "horovod/__init__.py": "from .. import distributed\nfrom ..training import loop  # breaks\n",
    "training/__init__.py": "",
    "training/loop.py": "from .. import horovod, distributed, models\n",
}


def _write_package(root: Path, files: Dict[str, str], name: str = "neural_arch") -> Path:
    for relative, text in files.items():
        path = root / name / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text.lstrip("\n"), encoding="utf-8")
    return root / name


def test_every_rule_of_the_table_reports_its_forbidden_arrows(tmp_path):
    package = _write_package(tmp_path, _SYNTHETIC)
    found = [(f"{a.path}:{a.line}", a.importer, a.imported) for a in broken_arrows(package,
                                                                                   LAYERS)]
    marked = sorted(f"neural_arch/{relative}:{number}" for relative, text in _SYNTHETIC.items()
                    for number, line in enumerate(text.lstrip("\n").splitlines(), 1)
                    if "# breaks" in line)
    assert sorted(where for where, _, _ in found) == marked, "\n".join(map(str, found))
    assert ("neural_arch/models/gpt.py:4", "neural_arch.models.gpt",
            "neural_arch.distributed.tensor_parallel.gpt") in found
    assert unplaced_modules(package, LAYERS) == []


def test_a_module_no_layer_holds_is_reported(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "", "core/__init__.py": "",
                                        "distributed/__init__.py": "",
                                        "distributed/newcomer.py": "", "toolbox.py": ""})
    assert unplaced_modules(package, LAYERS) == ["neural_arch.distributed.newcomer",
                                                 "neural_arch.toolbox"]


def test_known_violations_cover_their_arrows_and_stale_ones_are_reported(tmp_path):
    arrows = broken_arrows(_write_package(tmp_path, _SYNTHETIC), LAYERS)
    gpt = KnownViolation("neural_arch.models.gpt", "neural_arch.distributed", "why")
    gone = KnownViolation("neural_arch.models.mlp", "neural_arch.distributed", "why")
    unexpected, stale = split_known(arrows, [gpt, gone])
    assert [a for a in arrows if a not in unexpected] == [
        a for a in arrows if a.importer == "neural_arch.models.gpt"]
    assert len(unexpected) == len(arrows) - 1
    assert stale == [gone]


def test_a_table_whose_arrow_points_up_is_an_error(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "", "low.py": "", "high.py": ""})
    upside_down = (Layer("low", ("neural_arch.low",), ("high",)),
                   Layer("high", ("neural_arch.high", "neural_arch.__init__"), ("low",)))
    with pytest.raises(ValueError, match=r"layer 'low' may import 'high', which is above it"):
        broken_arrows(package, upside_down)


def test_a_relative_import_above_the_top_package_is_an_error(tmp_path):
    package = _write_package(tmp_path, {"__init__.py": "", "core/__init__.py": "",
                                        "core/engine.py": "from ...outside import x\n"})
    with pytest.raises(ValueError, match=r"engine.py:1: relative import \.\.\.outside goes "
                                         r"above the top package \(resolved against "
                                         r"'neural_arch.core'\)"):
        broken_arrows(package, LAYERS)


# ----- the import probe ------------------------------------------------------------------
def test_the_probe_reports_a_blocked_import_and_an_early_load(tmp_path):
    pytest.importorskip("numba")  # blocking proves something only where it is installed
    _write_package(tmp_path, {
        "__init__.py": "",
        "nn/__init__.py": "from .. import distributed\n",
        "fast.py": "import numba\n",
        "guarded.py": ("import importlib.util\n"
                       "HAS_NUMBA = importlib.util.find_spec('numba') is not None\n"),
        "distributed/__init__.py": "",
    }, name="probed")
    imported = probe_imports(["probed.guarded", "probed.nn", "probed.fast"], ["numba"],
                             tmp_path, watched="probed.distributed")
    assert imported["probed.guarded"] == ("", ())  # find_spec answers None, as uninstalled
    assert imported["probed.nn"].watched_loaded == ("probed.distributed",)
    assert "ModuleNotFoundError: import of numba halted" in imported["probed.fast"].error
    assert "numba" in sys.modules  # this process is untouched


def test_install_requires_is_read_from_setup_py(tmp_path):
    setup = tmp_path / "setup.py"
    setup.write_text('setup(name="x", install_requires=["numpy>=1.22", "scikit-learn >=1",'
                     ' "tqdm; python_version>\'3\'"])\n')
    assert required_distributions(setup) == ["numpy", "scikit-learn", "tqdm"]
    setup.write_text("setup(name='x', install_requires=REQUIREMENTS)\n")
    with pytest.raises(ValueError):
        required_distributions(setup)
