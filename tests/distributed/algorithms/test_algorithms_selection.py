"""Which algorithm runs a collective: size threshold, per-call and environment overrides."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed import algorithms
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports.base import Fingerprint
from threaded_transport import Fabric, run_threads

pytestmark = pytest.mark.timeout(60)

SMALL = algorithms.SMALL_MESSAGE_BYTES


class RecordingNative:
    """Stands in for MPI's collectives: sums with NumPy and records each call."""

    name, preferred = "native", False

    def __init__(self, inputs):
        self.inputs, self.calls = inputs, []

    def all_reduce(self, buf, op, fp=None):
        self.calls.append(("all_reduce", op))
        np.copyto(buf, np.sum(self.inputs, axis=0))


@pytest.fixture
def transport():
    return Fabric(2).transports()[0]


class Environment:
    """Sets the override variable as a user would: exported, then read by init_process_group."""

    def __init__(self, monkeypatch):
        self.monkeypatch = monkeypatch

    def set(self, value):
        self.monkeypatch.setenv(algorithms.ENV_ALLREDUCE_ALGO, value)
        algorithms.read_environment()


@pytest.fixture(autouse=True)
def env(monkeypatch):
    monkeypatch.delenv(algorithms.ENV_ALLREDUCE_ALGO, raising=False)
    algorithms.read_environment()
    yield Environment(monkeypatch)
    monkeypatch.undo()
    algorithms.read_environment()


def test_automatic_choice_by_size(transport):
    assert algorithms.select("all_reduce", transport, SMALL - 1) == "recursive_doubling"
    assert algorithms.select("all_reduce", transport, SMALL) == "ring"
    assert algorithms.select("broadcast", transport, 10) == "tree"
    assert algorithms.select("all_gather", transport, 10) == "ring"
    assert algorithms.select("reduce_scatter", transport, 10) == "ring"
    assert algorithms.select("barrier", transport, 0) == "dissemination"


def test_per_call_choice_and_aliases(transport):
    assert algorithms.select("all_reduce", transport, 10, "ring") == "ring"
    assert algorithms.select("all_reduce", transport, 10 * SMALL, "RD") == "recursive_doubling"
    assert algorithms.select("all_reduce", transport, 10, "recursive-doubling") == \
        "recursive_doubling"


def test_unknown_name_lists_the_choices(transport):
    with pytest.raises(ValueError) as info:
        algorithms.select("all_reduce", transport, 10, "butterfly")
    message = str(info.value)
    assert "'butterfly'" in message
    for name in algorithms.ALGORITHMS["all_reduce"]:
        assert name in message


def test_unknown_name_from_the_environment_raises(transport, env):
    env.set("butterfly")
    with pytest.raises(ValueError, match="butterfly"):
        algorithms.select("all_reduce", transport, 10)


def test_environment_forces_an_algorithm(transport, env):
    env.set("ring")
    assert algorithms.select("all_reduce", transport, 10) == "ring"
    # a per-call choice beats the environment
    assert algorithms.select("all_reduce", transport, 10, "recursive_doubling") == \
        "recursive_doubling"


def test_unrunnable_choice_raises_per_call_but_falls_back_from_environment(transport, env):
    for name in ("native", "shm_direct"):
        with pytest.raises(ValueError, match="cannot run here"):
            algorithms.select("all_reduce", transport, 10, name)
        env.set(name)
        assert algorithms.select("all_reduce", transport, 10) == "recursive_doubling"
        assert algorithms.select("all_reduce", transport, SMALL) == "ring"


def test_native_runs_the_transports_own_collective_with_a_sum(monkeypatch):
    inputs = [np.arange(5.0) * (r + 1) for r in range(2)]
    natives = [RecordingNative(inputs) for _ in range(2)]
    fabric = Fabric(2)
    for t, native in zip(fabric.transports(), natives):
        monkeypatch.setattr(type(t), "native_collectives",
                            lambda self, _n=natives: _n[self.rank], raising=True)

    def body(t):
        buf = inputs[t.rank].copy()
        used = algorithms.all_reduce(t, buf, ReduceOp.SUM,
                                     Fingerprint("all_reduce:sum", 1, "float64", 5), "native")
        return used, buf

    for used, buf in run_threads(2, body):
        assert used == "native"
        np.testing.assert_array_equal(buf, np.arange(5.0) * 3)
    assert [n.calls for n in natives] == [[("all_reduce", ReduceOp.SUM)]] * 2


@pytest.mark.parametrize("algorithm", [None, "ring", "recursive_doubling"])
def test_dispatch_reports_the_algorithm_it_ran(algorithm):
    size = 10

    def body(t):
        buf = np.full(size, t.rank + 1.0)
        used = algorithms.all_reduce(t, buf, ReduceOp.MAX,
                                     Fingerprint("all_reduce:max", 1, "float64", size), algorithm)
        return used, buf

    for used, buf in run_threads(3, body):
        assert used == (algorithm or "recursive_doubling")
        np.testing.assert_array_equal(buf, np.full(size, 3.0))
