"""Old module paths of ``neural_arch.distributed``, kept importable after the modules moved.

The package used to keep every module at its top level (``process_group``, ``heartbeat``,
``store``, ...); they now live in subpackages, one subsystem each. Code written against the
old paths, and pickles that name them, must keep working, and must see the *same* module:
``process_group._WORLD`` or a monkeypatch through the old name has to reach the state the
new module holds. So an old name is not a copy or a re-exporting shim but an alias:
:class:`MovedModuleFinder` answers imports of the names in :data:`MOVED` by importing the new
module and returning that very object, so ``sys.modules[old] is sys.modules[new]``.

The same finder answers torch's module paths where ours are named otherwise
(:data:`TORCH_PATHS`): ``import neural_arch as torch`` then ports
``from torch.distributed.algorithms.ddp_comm_hooks.ddp_zero_hook import ...``.

Importing this module installs the finder; ``neural_arch/distributed/__init__.py`` imports it
before anything else, so it is in place before any module of the package asks for an old name.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Optional, Sequence

_PACKAGE = __name__.rpartition(".")[0]  # neural_arch.distributed

# old name -> new name, both relative to neural_arch.distributed. ``group``, ``ddp`` and
# ``checkpoint`` were modules and are now the packages that hold their code (each re-exports
# the old module's public names); ``launcher`` and ``advanced`` stay real top-level modules.
MOVED = {
    "process_group": "group.world",
    "group_transport": "group.subgroup_transport",
    "backend_choice": "group.backend_choice",
    "naive_ddp": "ddp.naive",
    "advanced_ddp": "ddp.advanced",
    "bucket_storage": "ddp.buckets",
    "loss_scaler": "ddp.loss_scaler",
    "sampler": "ddp.sampler",
    "checkpoint_directory": "checkpoint.directory",
    "checkpoint_format": "checkpoint.format",
    "checkpoint_state": "checkpoint.state",
    "launcher_args": "launch.args",
    "launcher_config": "launch.config",
    "launcher_workers": "launch.workers",
    "store": "rendezvous.store",
    "store_protocol": "rendezvous.store_protocol",
    "store_server": "rendezvous.store_server",
    "auth": "rendezvous.auth",
    "env": "rendezvous.env",
    "heartbeat": "health.heartbeat",
    "heartbeat_monitors": "health.monitors",
    "mpi_heartbeat": "health.mpi_heartbeat",
    "preemption": "health.preemption",
    "reduction_kernels": "reductions.kernels",
    "compiled_sums": "reductions.compiled_sums",
    "sent_bytes": "transports.sent_bytes",
    "rooted_collectives": "collectives.rooted",
    "collective_args": "collectives.args",
    "object_collectives": "collectives.objects",
    "point_to_point": "collectives.point_to_point",
}

# torch's name -> ours, both relative to neural_arch.distributed (``algorithms`` is ours: the
# collective algorithms; torch keeps its DDP communication hooks under that name). Not
# torch's ``ddp_comm_hooks.powerSGD_hook`` module: importing it would set ``comm_hooks``'s
# attribute ``powerSGD_hook``, the hook function it offers, to the module.
TORCH_PATHS = {
    "algorithms.ddp_comm_hooks": "comm_hooks",
    "algorithms.ddp_comm_hooks.default_hooks": "comm_hooks.default_hooks",
    "algorithms.ddp_comm_hooks.ddp_zero_hook": "comm_hooks.ddp_zero_hook",
}

# ``python -m`` an old name that is also a command runs the module doing that command, under
# its own name (an alias run as ``__main__`` would resolve its relative imports wrongly).
COMMANDS = {
    "env": "rendezvous.report",
}


class _AliasLoader(importlib.abc.Loader):
    """Loads an old name as the already-imported module at its new name."""

    def __init__(self, new_name: str, command: Optional[str] = None) -> None:
        self.new_name, self.command = new_name, command

    def get_code(self, fullname: str):
        """What ``python -m <old name>`` runs (runpy asks the loader for code)."""
        if self.command is None:
            raise ImportError(f"{fullname} is another name of {self.new_name}; run that instead")
        return compile(f"import runpy\nrunpy.run_module({self.command!r}, run_name='__main__', "
                       f"alter_sys=True)\n", f"<python -m {fullname}>", "exec")

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = importlib.import_module(self.new_name)
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The import system has just set ``module.__spec__`` to the alias's spec; give the
        # module its own back, so it still knows its real name and location.
        module.__spec__ = self._own_spec


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds the old names in :data:`MOVED` and hands them to :class:`_AliasLoader`."""

    def __init__(self, package: str, moved: dict) -> None:
        self.targets = {f"{package}.{old}": f"{package}.{new}" for old, new in moved.items()}
        self.commands = {f"{package}.{old}": f"{package}.{new}" for old, new in COMMANDS.items()}

    def find_spec(self, fullname: str, path: Optional[Sequence[str]] = None,
                  target: Optional[ModuleType] = None) -> Optional[importlib.machinery.ModuleSpec]:
        new_name = self.targets.get(fullname)
        if new_name is None:
            return None
        return importlib.machinery.ModuleSpec(
            fullname, _AliasLoader(new_name, self.commands.get(fullname)))


def install() -> MovedModuleFinder:
    """Puts the finder first on ``sys.meta_path`` (once) and returns it."""
    for finder in sys.meta_path:
        if isinstance(finder, MovedModuleFinder):
            return finder
    finder = MovedModuleFinder(_PACKAGE, {**MOVED, **TORCH_PATHS})
    sys.meta_path.insert(0, finder)
    return finder


def import_moved(old: str) -> Optional[ModuleType]:
    """The module an old top-level name stands for, or ``None`` if ``old`` never moved."""
    if old not in MOVED:
        return None
    return importlib.import_module(f"{_PACKAGE}.{old}")


install()
