"""``Layout``: which part of a dense parameter each rank holds, and back (no processes)."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.tensor_parallel import Layout


@pytest.mark.parametrize("layout,shape", [(Layout(0), (8, 3)), (Layout(1), (3, 8)),
                                          (Layout(0, stride=2), (8,))])
@pytest.mark.parametrize("size", [1, 2, 4])
def test_shards_rebuild_the_dense_array(layout, shape, size):
    dense = np.arange(np.prod(shape), dtype=np.float64).reshape(shape)
    shards = [layout.shard(dense, rank, size) for rank in range(size)]
    assert all(s.flags.c_contiguous and layout.dense_shape(s.shape, size) == shape
               for s in shards)
    np.testing.assert_array_equal(layout.unshard(shards), dense)


def test_rows_and_columns_are_contiguous_chunks():
    dense = np.arange(24).reshape(4, 6)
    np.testing.assert_array_equal(Layout(0).shard(dense, 1, 2), dense[2:])
    np.testing.assert_array_equal(Layout(1).shard(dense, 2, 3), dense[:, 4:])


def test_stride_gives_each_rank_its_part_of_every_block():
    """Fused [q | k | v] rows, 2 heads of 1 row each, over 2 ranks: rank 1 holds head 1's
    q, k and v rows, not the second half of the packed rows."""
    q, k, v = ["q0", "q1"], ["k0", "k1"], ["v0", "v1"]
    dense = np.array(q + k + v)
    assert list(Layout(0, stride=3).shard(dense, 1, 2)) == ["q1", "k1", "v1"]
    assert list(Layout(0, stride=3).unshard([np.array(["q0", "k0", "v0"]),
                                             np.array(["q1", "k1", "v1"])])) == q + k + v


def test_a_dimension_that_does_not_split_is_a_value_error():
    with pytest.raises(ValueError, match=r"length 6 does not split into 3 block\(s\) x "
                                         r"tensor-parallel size 4"):
        Layout(0, stride=3).shard(np.zeros(6), 0, 4)
