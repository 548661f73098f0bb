"""Argument checks and the one-rank fast path of the public collectives (in this process)."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import distributed as dist
from neural_arch.core.tensor import Tensor

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("one_rank_group")]




def test_state_queries():
    assert dist.is_initialized()
    assert (dist.get_rank(), dist.get_world_size(), dist.get_local_rank()) == (0, 1, 0)
    info = dist.get_distributed_info()
    assert info["initialized"] and info["world_size"] == 1 and info["rank"] == 0
    assert set(info["available_transports"]) >= {"shm", "tcp"}
    with pytest.raises(RuntimeError, match="already initialized"):
        dist.init_process_group(world_size=1, rank=0)


@pytest.mark.parametrize("dtype", ["bool", "uint8", "int16", "complex64", "object"])
def test_unsupported_dtypes_are_named(dtype):
    with pytest.raises(TypeError, match=dtype):
        dist.all_reduce(np.zeros(3, dtype=dtype))


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
def test_average_needs_a_float_dtype(dtype):
    with pytest.raises(TypeError, match=np.dtype(dtype).name):
        dist.all_reduce(np.zeros(3, dtype=dtype), dist.ReduceOp.AVERAGE)


def test_unknown_reduce_op_and_algorithm():
    with pytest.raises(ValueError, match="median"):
        dist.all_reduce(np.zeros(3), "median")
    with pytest.raises(ValueError, match="butterfly"):
        dist.all_reduce(np.zeros(3), algorithm="butterfly")


@pytest.mark.parametrize("call", [
    lambda x: dist.broadcast(x, src=1),
    lambda x: dist.broadcast(x, src=-1),
    lambda x: dist.reduce(x, dst=3),
    lambda x: dist.gather(x, dst=2),
    lambda x: dist.scatter(x, [x], src=5),
    lambda x: dist.send(x, dst=1),
])
def test_ranks_out_of_range_name_value_and_world_size(call):
    with pytest.raises(ValueError, match=r"(src|dst)=-?\d+ is out of range for world size 1"):
        call(np.zeros(2))


def test_list_arguments_are_checked():
    x = np.zeros(4)
    with pytest.raises(ValueError, match="2 entries but the group has 1"):
        dist.all_gather([np.zeros(4), np.zeros(4)], x)
    with pytest.raises(ValueError, match=r"shape \(5,\)"):
        dist.all_gather([np.zeros(5)], x)
    with pytest.raises(TypeError, match="float32"):
        dist.all_gather([np.zeros(4, np.float32)], x)
    with pytest.raises(ValueError, match="scatter_list"):
        dist.scatter(x, None, src=0)
    with pytest.raises(ValueError, match="output must hold 1 x 4"):
        dist.all_gather_into_tensor(np.zeros(3), x)
    with pytest.raises(ValueError, match="object_list must be a list of 1"):
        dist.all_gather_object([None, None], 5)


def test_non_tensors_and_read_only_outputs_are_rejected():
    with pytest.raises(TypeError, match="list"):
        dist.all_reduce([1.0, 2.0])
    frozen = np.zeros(3)
    frozen.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dist.all_reduce(frozen)


def test_one_rank_collectives_return_their_input_unchanged():
    x = np.arange(6.0).reshape(2, 3)
    t = Tensor(x.copy())
    assert dist.all_reduce(x, dist.ReduceOp.AVERAGE) is x
    assert dist.all_reduce(t) is t and np.array_equal(t.array, x)
    assert dist.broadcast(x) is x and dist.reduce(x) is x
    np.testing.assert_array_equal(x, np.arange(6.0).reshape(2, 3))
    gathered = dist.all_gather(t)
    assert len(gathered) == 1 and isinstance(gathered[0], Tensor)
    np.testing.assert_array_equal(gathered[0].array, x)
    chunk = dist.reduce_scatter(x, dist.ReduceOp.SUM)
    np.testing.assert_array_equal(chunk, x)
    out = np.zeros(3)
    assert dist.reduce_scatter(out, [np.arange(3.0)]) is out
    np.testing.assert_array_equal(out, np.arange(3.0))
    assert dist.all_gather_object({"k": 1}) == [{"k": 1}]
    assert dist.broadcast_object_list([1, "a"]) == [1, "a"]
    work = dist.all_reduce(x, async_op=True)
    assert work.is_completed() and work.wait() and work.result() is x
    assert dist.barrier() is None


def test_subgroup_of_the_only_rank():
    group = dist.new_group([0])
    assert dist.get_rank(group) == 0 and dist.get_world_size(group) == 1
    x = np.ones(3)
    assert dist.all_reduce(x, group=group) is x
    with pytest.raises(ValueError, match="distinct, non-empty"):
        dist.new_group([0, 0])
    with pytest.raises(ValueError, match=r"in \[0, 1\)"):
        dist.new_group([1])
