"""The modules that moved into subpackages stay importable by their old paths, as the same objects.

Code and pickles written against ``neural_arch.distributed.heartbeat`` and the like must keep
working, and must reach the state the new module holds (``process_group._WORLD``, a monkeypatch
through the old name). The public entry points (``python -m neural_arch.distributed.launcher``,
``neural_arch.distributed.advanced``, ``.checkpoint``) keep their paths.
"""
import importlib
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from neural_arch.distributed import _moved
from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(120)

PACKAGE = "neural_arch.distributed"


def run_python(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, *args], cwd=REPO_ROOT, env=env, capture_output=True,
                          text=True, timeout=90)


@pytest.mark.parametrize("old, new", sorted(_moved.MOVED.items()))
def test_old_path_is_the_new_module(old, new):
    module = importlib.import_module(f"{PACKAGE}.{old}")
    assert module is importlib.import_module(f"{PACKAGE}.{new}")
    assert sys.modules[f"{PACKAGE}.{old}"] is sys.modules[f"{PACKAGE}.{new}"]
    # the module keeps its own identity: name, spec and file are those of its new home
    assert module.__name__ == module.__spec__.name == f"{PACKAGE}.{new}"
    assert Path(module.__file__).as_posix().endswith(new.replace(".", "/") + ".py")


def test_old_import_statements_work():
    import neural_arch.distributed.heartbeat as old_heartbeat
    from neural_arch.distributed import process_group
    from neural_arch.distributed.group import world
    from neural_arch.distributed.health import heartbeat
    from neural_arch.distributed.store import TCPStore
    from neural_arch.distributed.rendezvous.store import TCPStore as NewTCPStore

    assert old_heartbeat is heartbeat
    assert process_group is world
    assert TCPStore is NewTCPStore


def test_module_state_and_monkeypatching_go_through_the_old_name(monkeypatch):
    from neural_arch import distributed as dist
    from neural_arch.distributed import process_group
    from neural_arch.distributed.group import world

    sentinel = object()
    monkeypatch.setattr(process_group, "_WORLD", sentinel)
    assert world._WORLD is sentinel
    monkeypatch.setattr(f"{PACKAGE}.heartbeat.KEY_PREFIX", "patched")
    from neural_arch.distributed.health import heartbeat
    assert heartbeat.KEY_PREFIX == "patched"
    # the package's attribute of an old name is the moved module too
    assert dist.process_group is world
    assert dist.mpi_heartbeat is importlib.import_module(f"{PACKAGE}.health.mpi_heartbeat")


def test_names_that_became_packages_keep_their_public_names():
    from neural_arch.distributed import checkpoint, ddp, group, launcher
    from neural_arch.distributed.checkpoint import manager
    from neural_arch.distributed.ddp.data_parallel import DistributedDataParallel
    from neural_arch.distributed.group.process_group import ProcessGroup
    from neural_arch.distributed.launch import supervisor

    for name in manager.__all__:
        assert getattr(checkpoint, name) is getattr(manager, name)
    assert set(checkpoint.__all__) == set(manager.__all__)
    assert ddp.DistributedDataParallel is DistributedDataParallel
    assert group.ProcessGroup is ProcessGroup
    for name in launcher.__all__:
        assert getattr(launcher, name) is getattr(supervisor, name)


def test_classes_pickled_under_an_old_path_still_load():
    from neural_arch.distributed.health.heartbeat import HeartbeatConfig

    config = HeartbeatConfig(True, 0.5, 6.0)
    # protocol 0 names the class as text, so the path can be rewritten in place
    old = pickle.dumps(config, protocol=0).replace(b"neural_arch.distributed.health.heartbeat",
                                                   b"neural_arch.distributed.heartbeat")
    assert b"neural_arch.distributed.heartbeat" in old
    assert pickle.loads(old) == config


def test_old_paths_resolve_in_a_fresh_process_before_the_new_ones():
    code = ("import sys\n"
            "import neural_arch.distributed.store_server as old\n"
            "from neural_arch.distributed.launcher_args import PROG\n"
            "import neural_arch.distributed.rendezvous.store_server as new\n"
            "assert old is new and PROG.endswith('distributed.launcher'), (old, new)\n"
            "assert sys.modules['neural_arch.distributed.launcher_args'] is "
            "sys.modules['neural_arch.distributed.launch.args']\n")
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr


def test_importing_the_package_stays_light():
    code = ("import sys, neural_arch.distributed as d\n"
            "heavy = [m for m in sys.modules if m.startswith(('neural_arch.distributed.launch',"
            " 'neural_arch.distributed.checkpoint', 'neural_arch.distributed.ddp',"
            " 'neural_arch.distributed.rendezvous.store', 'neural_arch.nn'))]\n"
            "assert not heavy, heavy\n"
            "print(d.DistributedDataParallel.__module__)\n")
    result = run_python("-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"{PACKAGE}.ddp.data_parallel"


def test_launcher_command_line_keeps_its_path():
    result = run_python("-m", f"{PACKAGE}.launcher", "--help")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"usage: python -m {PACKAGE}.launcher")
    result = run_python("-m", f"{PACKAGE}.launcher", "--no_such_option", "train.py")
    assert result.returncode == 2
    assert "unrecognized arguments" in result.stderr or "no_such_option" in result.stderr
