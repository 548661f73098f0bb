"""Which layer of ``neural_arch`` may import which: the table of docs/architecture.md, checked.

The layers only stay replaceable if the arrows between them point one way: the model code must
run without the distributed package, the backends must stay array-level, the collective
algorithms reach a transport only through its base interface, and a transport knows nothing of
the algorithms, groups or collectives above it. Nothing is imported to check this: every module
under ``neural_arch/`` is parsed and every import in it resolved, including imports inside
functions (``tests/import_graph.py``); ``tests/import_layers.py`` holds the checker, and
``tests/test_import_checker.py`` shows it failing on a package made to break each rule.
"""
from __future__ import annotations

from pathlib import Path

import pytest

from import_graph import find_modules, imports_of
from import_layers import (EVERYTHING_BELOW, KnownViolation, Layer, broken_arrows, split_known,
                           unplaced_modules)
from import_probe import optional_packages, probe_imports

pytestmark = pytest.mark.timeout(60)

REPO_ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIR = REPO_ROOT / "neural_arch"
_D = "neural_arch.distributed"

# bottom to top, as in the doc's table; a layer may import only layers above it in this list
LAYERS = (
    Layer("package helpers", ("neural_arch._environ", "neural_arch._lazy", "neural_arch._files"),
          ()),
    Layer("backends", ("neural_arch.backends",), ("package helpers",)),
    Layer("core", ("neural_arch.core",), ("backends", "package helpers")),
    Layer("model code", ("neural_arch.nn", "neural_arch.optim", "neural_arch.data",
                         "neural_arch.models", "neural_arch.utils", "neural_arch.functional",
                         "neural_arch.amp", "neural_arch.cuda"),
          ("core", "backends", "package helpers")),
    Layer("distributed basics", (f"{_D}.errors", f"{_D}.reduce_ops", f"{_D}.processes",
                                 f"{_D}.reductions", f"{_D}.scratch"),
          ("package helpers",)),
    Layer("rendezvous", (f"{_D}.rendezvous",), ("distributed basics", "package helpers")),
    # the failure detector collectives and transports consult; preemption sits with the tools
    Layer("health checks", (f"{_D}.health",),
          ("rendezvous", "distributed basics", f"{_D}.transports.base", "package helpers")),
    Layer("transports", (f"{_D}.transports",),
          ("health checks", "rendezvous", "distributed basics", "backends", "package helpers")),
    Layer("algorithms", (f"{_D}.algorithms",),
          (f"{_D}.transports.base", "distributed basics", "package helpers")),
    Layer("groups", (f"{_D}.group", f"{_D}.work", f"{_D}.profiler",
                    f"{_D}.transports.sent_bytes"),
          ("algorithms", "transports", "health checks", "rendezvous", "distributed basics",
           "package helpers")),
    Layer("collectives", (f"{_D}.collectives", f"{_D}.buffers"),
          ("groups", "algorithms", "transports", "health checks", "rendezvous",
           "distributed basics", "backends", "package helpers")),
    Layer("tools", (f"{_D}.__init__", f"{_D}._moved", f"{_D}.ddp", f"{_D}.fsdp", f"{_D}.optim",
                    f"{_D}.comm_hooks", f"{_D}.checkpoint", f"{_D}.launch", f"{_D}.launcher",
                    f"{_D}.health.preemption", f"{_D}.tensor_parallel", f"{_D}.pipelining",
                    f"{_D}.parallel3d", f"{_D}.device_mesh", f"{_D}.replicas",
                    f"{_D}.advanced", f"{_D}.sync_batchnorm"),
          (EVERYTHING_BELOW,)),
    # torch's paths into distributed: the model code never imports them
    Layer("torch's doors to distributed", ("neural_arch.nn.parallel",
                                           "neural_arch.nn.sync_batchnorm",
                                           "neural_arch.utils.data.distributed"),
          (EVERYTHING_BELOW,)),
    Layer("save and load", ("neural_arch.serialization",),
          ("model code", "core", "backends", "package helpers",
           f"{_D}.checkpoint.owner")),  # a save records its temporary file's writer
    Layer("package face", ("neural_arch.__init__",),
          ("save and load", "model code", "core", "backends", "package helpers")),
    Layer("horovod", ("neural_arch.horovod",), (EVERYTHING_BELOW,)),
    Layer("training", ("neural_arch.training", "neural_arch.train_gpt",
                       "neural_arch.plot_metrics", "neural_arch.cli", "neural_arch.tune",
                       "neural_arch.ray", "neural_arch.tabgpt", "neural_arch.serve"),
          (EVERYTHING_BELOW,)),
)

# imports the table forbids that the code still makes (importer, imported module and what is
# under it, why); each must still occur, so an entry goes once its import is gone
KNOWN_VIOLATIONS = (
)


# ----- the table, on neural_arch ---------------------------------------------------------
def test_every_module_belongs_to_a_layer():
    assert unplaced_modules(PACKAGE_DIR, LAYERS) == []


def test_no_module_imports_across_a_forbidden_arrow():
    unexpected, stale = split_known(broken_arrows(PACKAGE_DIR, LAYERS), KNOWN_VIOLATIONS)
    assert not unexpected, f"{len(unexpected)} forbidden imports:\n  " + "\n  ".join(
        map(str, unexpected))
    assert not stale, ("these known violations no longer occur; remove them from "
                       "KNOWN_VIOLATIONS:\n  "
                       + "\n  ".join(f"{v.importer} -> {v.imported}" for v in stale))


def test_the_checker_sees_the_real_imports():
    # guards the tests above against passing on an empty or misread tree
    modules = find_modules(PACKAGE_DIR)
    assert len(modules) > 100, sorted(modules)
    fused = modules["neural_arch.core.fused_kernels"]
    targets = {target for target, _ in imports_of(fused, set(modules))}
    assert {"neural_arch.backends.kernels.dispatch", "neural_arch.core.tensor"} <= targets, targets
    # an import inside a function body
    preemption = modules[f"{_D}.health.preemption"]
    targets = {target for target, _ in imports_of(preemption, set(modules))}
    assert f"{_D}.group.world" in targets, targets


def test_the_doc_table_has_these_layers_in_this_order():
    text = (REPO_ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = text.split("\n## The layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| ")]
    names = [row.split("|")[1].strip() for row in rows[1:]]  # past the header
    assert names == [layer.name for layer in LAYERS]


# ----- the rules at run time, without the optional packages ------------------------------
# imported in this order; the first ones must load nothing of neural_arch.distributed
_LIGHT = ("neural_arch", "neural_arch.nn", "neural_arch.nn.functional", "neural_arch.optim",
          "neural_arch.data", "neural_arch.models", "neural_arch.utils", "neural_arch.utils.data",
          "neural_arch.nn.parallel", "neural_arch.serialization")
_HEAVY = ("neural_arch.distributed", "neural_arch.horovod", "neural_arch.training",
          "neural_arch.train_gpt", "neural_arch.tune")


def test_the_package_imports_without_the_optional_packages_and_nn_stays_light():
    blocked = optional_packages(REPO_ROOT / "setup.py")
    assert {"numba", "mpi4py", "cupy", "torch", "matplotlib", "tensorboardX", "optuna",
            "mlflow"} <= set(blocked)
    imported = probe_imports(_LIGHT + _HEAVY, blocked, REPO_ROOT, watched=_D)
    failed = {name: result.error for name, result in imported.items() if result.error}
    assert not failed, "\n".join(f"{name}:\n{error}" for name, error in failed.items())
    assert imported[_LIGHT[-1]].watched_loaded == (), imported[_LIGHT[-1]]
    assert _D in imported[_HEAVY[0]].watched_loaded  # the watch does see distributed
