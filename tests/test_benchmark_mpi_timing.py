"""The mpi benchmarks' shared timing (``bench_common.mpi_medians_in_turns``) with a fake
communicator and a fake clock, and the benchmarks calling the package by its public names only:
a benchmark that reaches into a module's private function breaks, unseen, when that module is
reworked (``mpi_layers.py``, ``mpi_pair_forms.py`` and ``mpi_fresh_inputs.py`` run under
mpiexec, in no test)."""
from __future__ import annotations

import ast
import random
import sys
from types import SimpleNamespace

import pytest

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(30)
BENCHMARKS_DIR = REPO_ROOT / "benchmarks"
sys.path.insert(0, str(BENCHMARKS_DIR))

import bench_common  # noqa: E402

# bench_numba times the NumPy and Numba forms of kernels, which the package keeps private
TIMES_PRIVATE_FORMS = {"bench_numba.py"}


class TwoRankComm:
    """The calls of an mpi4py communicator the timing makes; the peer rank always took
    ``PEER_FACTOR`` times as long."""
    PEER_FACTOR = 2.0

    def __init__(self, log: list) -> None:
        self.log = log

    def Barrier(self) -> None:  # noqa: N802 - mpi4py's name
        self.log.append("barrier")

    def allgather(self, value: float) -> list:
        return [value, value * self.PEER_FACTOR]


def test_rows_are_timed_in_turns_after_a_barrier_and_give_the_slowest_ranks_median(
        monkeypatch):
    clock, log = [0.0], []
    monkeypatch.setattr(bench_common, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def row(name: str, seconds_per_batch: list):
        """A call that takes the next batch's seconds per call, as the fake clock counts."""
        batches = iter(seconds_per_batch)
        state = {}

        def call():
            if log[-1] == "barrier":  # a new batch begins
                state["seconds"] = next(batches)
            log.append(name)
            clock[0] += state["seconds"]
        return call

    # the first batch of each is the untimed one; then 3 rounds (medians 3 and 20)
    calls = {"ours": row("ours", [100.0, 1.0, 5.0, 3.0]),
             "theirs": row("theirs", [100.0, 40.0, 10.0, 20.0])}
    medians = bench_common.mpi_medians_in_turns(TwoRankComm(log), calls, nbytes=16 << 20,
                                                rounds=3, most_calls=1000)
    assert medians == pytest.approx({"ours": 6.0, "theirs": 40.0})
    # 32 MiB a batch: two calls of 16 MiB, each row's batch after a barrier, in turns: the
    # untimed batches in the rows' order, then each round in its own order, the same on every
    # rank (seeded by the round), so that no row always follows the same other one
    rounds = [["ours", "theirs"]]
    for turn in range(3):
        order = ["ours", "theirs"]
        random.Random(turn).shuffle(order)
        rounds.append(order)
    assert len({tuple(order) for order in rounds[1:]}) == 2, rounds
    assert log == [entry for order in rounds for name in order
                   for entry in ("barrier", name, name)]


@pytest.mark.parametrize("nbytes,most_calls,expected", [(4, 1000, 1000), (4, 2000, 2000),
                                                        (1 << 20, 1000, 32), (64 << 20, 9, 1),
                                                        (0, 5, 5)])
def test_a_batch_moves_about_32_mib_within_its_bounds(nbytes, most_calls, expected):
    log = []
    bench_common.mpi_batch_seconds(TwoRankComm(log), lambda: log.append("call"), nbytes,
                                   most_calls)
    assert log == ["barrier"] + ["call"] * expected


def _private_names_reached(path) -> list:
    """``module._name`` (and ``from module import _name``) where ``module`` came from
    ``neural_arch``; dunder names are public."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    ours, reached = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("neural_arch"):
            ours.update(alias.asname or alias.name for alias in node.names)
            reached += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        elif isinstance(node, ast.Import):
            ours.update(alias.asname or alias.name.split(".")[0] for alias in node.names
                        if alias.name.split(".")[0] == "neural_arch")
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                and not node.attr.startswith("__"):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in ours:
                reached.append(ast.unparse(node))
    return sorted(set(reached))


def test_benchmarks_call_the_package_by_its_public_names():
    reaching = {path.name: _private_names_reached(path)
                for path in sorted(BENCHMARKS_DIR.glob("*.py"))
                if path.name not in TIMES_PRIVATE_FORMS}
    assert not {name: found for name, found in reaching.items() if found}, (
        "benchmarks reaching into private names of neural_arch")
