"""``launch_distributed_training`` and ``DistributedLauncher`` from Python: a script target and a
callable target run in spawned workers with the same environment contract."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from neural_arch.distributed.launcher import DistributedLauncher, launch_distributed_training

try:
    from launcher_support import CONTRACT, free_port, job  # noqa: F401  (fixture)
except ImportError:  # the tests directory imported as a package
    from tests.launcher_support import CONTRACT, free_port, job  # noqa: F401

pytestmark = pytest.mark.timeout(120)


def record_contract(out_dir: str, tag: str) -> None:
    """A callable target: writes this worker's contract, then prints to both streams."""
    import sys
    env = {key: os.environ.get(key) for key in CONTRACT}
    Path(out_dir, f"{tag}_{env['RANK']}_{env['RESTART_COUNT']}.json").write_text(json.dumps(env))
    print(f"callable rank {env['RANK']}")
    print(f"callable stderr {env['RANK']}", file=sys.stderr)


def fail_on_rank_one(out_dir: str) -> None:
    """A callable target whose rank 1 raises on the first attempt, once rank 0 has written."""
    import time
    record_contract(out_dir, "env")
    if os.environ["RANK"] == "1" and os.environ["RESTART_COUNT"] == "0":
        deadline = time.monotonic() + 30
        while not Path(out_dir, "env_0_0.json").exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        raise RuntimeError("rank one gives up")


def test_script_target(job, capsys):
    script = job.dir / job.script("dump_env()\nprint('script says hi')\n")
    port = free_port()
    code = launch_distributed_training(str(script), nproc_per_node=2, master_port=port,
                                       backend="shm", script_args=["--lr", 0.5],
                                       env={"LAUNCHER_TEST_OUT": str(job.out)})
    assert code == 0
    envs = job.envs()
    assert sorted(envs) == [(0, 0), (1, 0)]
    for (rank, _), env in envs.items():
        assert env["argv"] == ["--lr", "0.5"]
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["MASTER_PORT"],
                env["NEURAL_ARCH_BACKEND"]) == (str(rank), str(rank), "2", str(port), "shm")
    out = capsys.readouterr().out.splitlines()
    assert {"[rank 0] script says hi", "[rank 1] script says hi"} <= set(out)


def test_callable_target_gets_the_contract(tmp_path, capsys):
    port = free_port()
    code = launch_distributed_training(record_contract, nproc_per_node=3, master_port=port,
                                       script_args=(str(tmp_path), "fn"))
    assert code == 0
    for rank in range(3):
        env = json.loads((tmp_path / f"fn_{rank}_0.json").read_text())
        assert (env["RANK"], env["LOCAL_RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"],
                env["GROUP_RANK"], env["MASTER_ADDR"], env["MASTER_PORT"]) == \
            (str(rank), str(rank), "3", "3", "0", "127.0.0.1", str(port))
        assert env["PYTHONUNBUFFERED"] == "1" and env["OMP_NUM_THREADS"] == "1"
    captured = capsys.readouterr()
    assert {f"[rank {r}] callable rank {r}" for r in range(3)} <= set(captured.out.splitlines())
    assert {f"[rank {r}] callable stderr {r}" for r in range(3)} <= \
        set(captured.err.splitlines())


def test_callable_that_raises_fails_the_job(tmp_path, capsys):
    code = launch_distributed_training(fail_on_rank_one, nproc_per_node=2,
                                       master_port=free_port(), script_args=(str(tmp_path),))
    assert code == 1
    err = capsys.readouterr().err
    assert "[rank 1] RuntimeError: rank one gives up" in err.splitlines()
    assert "rank 1 failed with exit code 1" in err


def test_outcome_names_how_the_run_ended_and_which_rank_failed(tmp_path):
    launcher = DistributedLauncher(fail_on_rank_one, nproc_per_node=2, master_port=free_port(),
                                   script_args=(str(tmp_path),))
    assert launcher.run() == 1
    assert launcher.outcome == ("failure", 1, 1)
    assert launcher.outcome.rank == 1
    launcher = DistributedLauncher(record_contract, nproc_per_node=2, master_port=free_port(),
                                   script_args=(str(tmp_path), "ok"))
    assert launcher.run() == 0
    assert launcher.outcome == ("success", -1, 0)


def test_launcher_class_restarts_a_callable(tmp_path, capsys):
    launcher = DistributedLauncher(fail_on_rank_one, nproc_per_node=2, master_port=free_port(),
                                   script_args=(str(tmp_path),), max_restarts=1,
                                   log_dir=tmp_path / "logs")
    assert launcher.ranks == [0, 1]
    assert launcher.run() == 0
    written = sorted(p.stem for p in tmp_path.glob("env_*.json"))
    assert written == ["env_0_0", "env_0_1", "env_1_0", "env_1_1"]
    log = (tmp_path / "logs" / "rank_1.log").read_text()
    assert "RuntimeError: rank one gives up" in log and "callable rank 1" in log
    assert "restarting all 2 workers" in capsys.readouterr().err


def test_unpicklable_callable_is_rejected(tmp_path):
    with pytest.raises(TypeError, match="cannot pickle"):
        launch_distributed_training(lambda: None, nproc_per_node=2, master_port=free_port())


@pytest.mark.parametrize("kwargs, fragment", [
    ({"nproc_per_node": 0}, "nproc_per_node must be a positive integer or 'auto', got 0"),
    ({"nnodes": 2, "node_rank": 2}, "node_rank must be < nnodes, got node_rank=2 with nnodes=2"),
    ({"backend": "carrier-pigeon"}, "got 'carrier-pigeon'"),
    ({"master_port": 70000}, "master_port must be in [1, 65535], got 70000"),
    ({"max_restarts": -1}, "max_restarts must be >= 0, got -1"),
])
def test_bad_configuration_is_named(tmp_path, kwargs, fragment):
    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(ValueError) as info:
        DistributedLauncher(str(script), **kwargs)
    assert fragment in str(info.value)


def test_missing_script_is_named(tmp_path):
    missing = tmp_path / "absent.py"
    with pytest.raises(ValueError, match="script not found") as info:
        launch_distributed_training(str(missing))
    assert str(missing) in str(info.value)


MAIN_SCRIPT = """
import os, sys
from pathlib import Path
from neural_arch.distributed.launcher import launch_distributed_training

def train(out_dir):
    Path(out_dir, "rank_" + os.environ["RANK"]).write_text(os.environ["WORLD_SIZE"])

{call}
"""


@pytest.mark.parametrize("guarded", [True, False])
def test_callable_from_a_main_script(job, guarded):
    call = f"sys.exit(launch_distributed_training(train, 2, master_port={free_port()}, " \
           f"script_args=[{str(job.out)!r}]))"
    if guarded:
        call = "if __name__ == '__main__':\n    " + call
    (job.dir / "main.py").write_text(MAIN_SCRIPT.format(call=call))
    proc = subprocess.run([sys.executable, "main.py"], cwd=job.dir, env=job.env(),
                          capture_output=True, text=True, timeout=60)
    if guarded:
        assert proc.returncode == 0, proc.stderr
        assert sorted(p.name for p in job.out.iterdir()) == ["rank_0", "rank_1"]
        assert {p.read_text() for p in job.out.iterdir()} == {"2"}
    else:  # each spawned worker refuses to launch again while importing the main module
        assert proc.returncode == 1
        assert "bootstrapping phase" in proc.stderr
        assert list(job.out.iterdir()) == []
