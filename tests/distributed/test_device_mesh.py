"""init_device_mesh on real processes: coordinates, one working group per axis, bad shapes.

Each rank's coordinate is checked against NumPy's row-major layout of the world, and each
axis group is used: an all-reduce of the global rank over it must give the sum of exactly the
ranks that share this rank's other coordinates.
"""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks


def _mesh_facts(rank, world_size, shape, names):
    from neural_arch import distributed as dist
    mesh = dist.init_device_mesh(shape, mesh_dim_names=names)
    grid = np.arange(world_size).reshape(shape)
    facts = {"coordinate": mesh.get_coordinate(), "sums": {}, "sizes": {}, "local": {}}
    for axis, name in enumerate(names):
        group = mesh.get_group(name)
        value = np.array([float(rank)])
        dist.all_reduce(value, group=group)
        facts["sums"][name] = float(value[0])
        facts["sizes"][name] = mesh.size(name)
        facts["local"][name] = mesh.get_local_rank(name)
        # the members this rank expects: its coordinate with ``axis`` free
        index = list(np.argwhere(grid == rank)[0])
        index[axis] = slice(None)
        expected = grid[tuple(index)]
        assert sorted(group.ranks) == sorted(int(r) for r in expected), (name, group.ranks)
        facts["sums"][name + "_expected"] = float(expected.sum())
    return facts


@pytest.mark.parametrize("shape", [(2, 2, 2), (4, 1, 2), (1, 8, 1)])
def test_mesh_coordinates_and_groups_on_eight_ranks(shape):
    names = ("dp", "tp", "pp")
    results = run_ranks(_mesh_facts, 8, "shm", timeout=90, args=(shape, names))
    grid = np.arange(8).reshape(shape)
    for rank, facts in enumerate(results):
        assert tuple(facts["coordinate"]) == tuple(int(c) for c in np.argwhere(grid == rank)[0])
        for axis, name in enumerate(names):
            assert facts["sums"][name] == facts["sums"][name + "_expected"]
            assert facts["sizes"][name] == shape[axis]
            assert facts["local"][name] == facts["coordinate"][axis]


def test_two_dimensional_mesh_every_transport(backend):
    results = run_ranks(_mesh_facts, 4, backend, timeout=60, args=((2, 2), ("dp", "tp")))
    # rank 3 = (1, 1): its dp group is {1, 3}, its tp group {2, 3}
    assert results[3]["sums"] == {"dp": 4.0, "dp_expected": 4.0, "tp": 5.0, "tp_expected": 5.0}


def _bad_mesh(rank, world_size, shape, names):
    from neural_arch import distributed as dist
    try:
        dist.init_device_mesh(shape, mesh_dim_names=names)
    except (ValueError, TypeError) as exc:
        return type(exc).__name__, str(exc)
    return None


def test_shape_that_does_not_multiply_to_the_world_is_refused():
    results = run_ranks(_bad_mesh, 4, "shm", timeout=60, args=((2, 3), ("dp", "tp")))
    for kind, message in results:
        assert kind == "ValueError"
        assert "(2, 3)" in message and "6" in message and "4" in message


def test_names_must_match_the_dimensions_and_be_distinct():
    results = run_ranks(_bad_mesh, 2, "shm", timeout=60, args=((2,), ("dp", "tp")))
    assert all(kind == "ValueError" and "2 names" in msg for kind, msg in results)
    results = run_ranks(_bad_mesh, 4, "shm", timeout=60, args=((2, 2), ("dp", "dp")))
    assert all(kind == "ValueError" and "distinct" in msg for kind, msg in results)


def _torch_spelling(rank, world_size):
    from neural_arch import distributed as dist
    mesh = dist.init_device_mesh("cpu", (world_size,))
    value = np.array([1.0])
    dist.all_reduce(value, group=mesh.get_group())
    with pytest.raises(KeyError, match="'tp'"):
        mesh.get_group("tp")
    return mesh.mesh_dim_names, mesh.get_local_rank(), float(value[0]), repr(mesh)


def test_torch_spelling_with_a_device_type_and_default_names():
    results = run_ranks(_torch_spelling, 2, "shm", timeout=60)
    assert results[1][:3] == (("dim0",), 1, 2.0)
    assert "dim0=2" in results[1][3]
