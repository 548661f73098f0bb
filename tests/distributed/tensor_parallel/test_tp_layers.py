"""The tensor-parallel layers against their dense counterparts, on real processes: forward
outputs and every gradient (inputs and parameters) at tp = 2 and 4, in float64."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from tp_cases import (column_case, cross_entropy_case, embedding_case, non_divisible_case,
                      pair_case, row_case)

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("gather_output", [False, True])
def test_column_parallel_linear(tp, gather_output):
    assert run_ranks(column_case, tp, "shm", timeout=60, args=(gather_output,)) == [2] * tp


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("input_is_parallel", [True, False])
def test_row_parallel_linear(tp, input_is_parallel):
    assert run_ranks(row_case, tp, "shm", timeout=60, args=(input_is_parallel,)) == [2] * tp


@pytest.mark.parametrize("tp", [2, 4])
def test_column_then_row_on_every_transport(backend, tp):
    results = run_ranks(pair_case, tp, backend, timeout=60)
    assert [checked for checked, _ in results] == [4] * tp
    for _, output in results[1:]:  # the all-reduce leaves the same output on every rank
        np.testing.assert_array_equal(output, results[0][1])


@pytest.mark.parametrize("tp", [2, 4])
def test_vocab_parallel_embedding(tp):
    assert run_ranks(embedding_case, tp, "shm", timeout=60) == [1] * tp


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("scale", [1.0, 300.0])  # 300: exp would overflow without the max
def test_vocab_parallel_cross_entropy(tp, scale):
    losses = run_ranks(cross_entropy_case, tp, "shm", timeout=60, args=(scale,))
    assert len(set(losses)) == 1  # the same loss on every rank


def test_sizes_that_do_not_divide_raise_value_error():
    messages = run_ranks(non_divisible_case, 4, "shm", timeout=60)[0]
    assert "ColumnParallelLinear" in messages[0] and "(6)" in messages[0] \
        and "size 4" in messages[0]
    assert "RowParallelLinear" in messages[1] and "in_features (6)" in messages[1]
    assert "VocabParallelEmbedding" in messages[2] and "num_embeddings (10)" in messages[2]
    assert "n_head (3)" in messages[3] and "size 4" in messages[3]
    assert "vocab_size (65)" in messages[4]
