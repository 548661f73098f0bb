"""torchrun's PET_* variables (as Kubeflow's trainer sets them) are the launcher's defaults:
PET_NPROC_PER_NODE=2 with no flag starts two workers; a flag still wins; a bad value is
refused naming the variable."""
from __future__ import annotations

import pytest

try:
    from launcher_support import free_port, job  # noqa: F401  (fixture)
except ImportError:  # the tests directory imported as a package
    from tests.launcher_support import free_port, job  # noqa: F401

from neural_arch.distributed.launch.args import parse_launcher_args
from neural_arch.distributed.launch.torchrun_env import pet_defaults

pytestmark = pytest.mark.timeout(120)

WORKER = """
(OUT / f"rank_{RANK}").write_text(f"{os.environ['RANK']} {os.environ['WORLD_SIZE']} "
                                  f"{os.environ['MASTER_PORT']}")
"""


def test_pet_nproc_per_node_starts_that_many_workers(job):
    port = free_port()
    result = job.run(job.script(WORKER), env=job.env(PET_NPROC_PER_NODE="2",
                                                     PET_MASTER_PORT=str(port)))
    assert result.returncode == 0, result.stderr
    started = sorted(path.read_text() for path in job.out.glob("rank_*"))
    assert started == [f"0 2 {port}", f"1 2 {port}"]


def test_flags_win_over_pet_variables(monkeypatch):
    monkeypatch.setenv("PET_NPROC_PER_NODE", "4")
    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_NODE_RANK", "1")
    monkeypatch.setenv("PET_MASTER_ADDR", "trainer-0")
    args = parse_launcher_args(["--nproc-per-node=3", "train.py"])
    assert (args.nproc_per_node, args.nnodes, args.node_rank, args.master_addr) == (
        "3", 2, 1, "trainer-0")


@pytest.mark.parametrize("env, expected", [
    ({}, {}),
    ({"PET_NNODES": "2:2", "PET_MASTER_PORT": "23456", "PET_NPROC_PER_NODE": "auto"},
     {"nnodes": 2, "master_port": 23456, "nproc_per_node": "auto"}),
])
def test_pet_values(env, expected):
    assert pet_defaults(set(), env) == (expected, [])


@pytest.mark.parametrize("env, message", [
    ({"PET_NNODES": "1:4"}, "PET_NNODES='1:4' is not valid for --nnodes"),
    ({"PET_NPROC_PER_NODE": "0"}, "PET_NPROC_PER_NODE='0' is not valid for --nproc_per_node"),
    ({"PET_MASTER_PORT": "http"}, "PET_MASTER_PORT='http' is not valid for --master_port"),
])
def test_bad_pet_values_are_refused_naming_the_variable(env, message, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SystemExit):
        parse_launcher_args(["train.py"])
    assert message in capsys.readouterr().err
