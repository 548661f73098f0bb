"""The tensor-parallel GPT against the dense one: a block, and the whole model (initialisation,
logits, loss, every gradient, AdamW steps and the gathered dense state), at tp = 2 and 4."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import each_case, job_once, run_ranks
from tp_gpt_cases import (block_case, gpt_case, gpt_checkpointing_and_generate_case,
                           gpt_subgroups_case)

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("tp", [2, 4])
def test_block_matches_dense_with_one_all_reduce_per_sub_block(tp):
    results = run_ranks(block_case, tp, "shm", timeout=60)
    # 4 LayerNorm, 4 attention and 4 MLP parameters; attention and MLP one all-reduce each way
    one_each = {"all_reduce": 2, "all_gather_into_tensor": 0, "reduce_scatter_tensor": 0}
    assert results == [(12, one_each, one_each)] * tp


@pytest.mark.parametrize("tp", [2, 4])
def test_sequence_parallel_block_matches_dense(tp):
    results = run_ranks(block_case, tp, "shm", timeout=60, args=(True,))
    forward = {"all_reduce": 0, "all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
    # backward: the same two of each, and the gradients of the 6 replicated parameters used
    # on a sequence shard (2 LayerNorms' weight and bias, 2 row-parallel biases) summed
    backward = {"all_reduce": 6, "all_gather_into_tensor": 2, "reduce_scatter_tensor": 2}
    assert results == [(12, forward, backward)] * tp


def gpt_both_layouts(rank, size, steps):
    """``gpt_case`` without and with sequence parallelism, in one job: {sequence_parallel:
    its result}. Each builds its models afresh from the same seeds."""
    return each_case(lambda sp: gpt_case(rank, size, steps, sp), (False, True),
                     "gpt_case(sequence_parallel)")


# One job per (backend, tp) runs both layouts (the first of their two tests starts it, the
# other reads its result): a process start-up less per pair, seconds under mpiexec.
_GPT_JOBS: dict = {}


def gpt_results(backend: str, tp: int, sequence_parallel: bool) -> list:
    job = job_once(_GPT_JOBS, (backend, tp), lambda: run_ranks(
        gpt_both_layouts, tp, backend, timeout=200, args=(3,)))
    return [by_layout[sequence_parallel] for by_layout in job]


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("tp", [2, 4])
def test_gpt_trains_as_dense_on_every_transport(backend, tp, sequence_parallel):
    results = gpt_results(backend, tp, sequence_parallel)
    replicated, state, losses = results[0]
    assert replicated and all(np.all(np.isfinite(g)) for g in replicated.values())
    for other, other_state, other_losses in results[1:]:
        # LayerNorms, position embeddings and the biases added after an all-reduce are
        # replicated: their gradients are bit-identical on every rank, with no communication
        for name, grad in replicated.items():
            np.testing.assert_array_equal(other[name], grad, err_msg=name)
        for key, value in state.items():
            np.testing.assert_array_equal(other_state[key], value, err_msg=key)
        assert other_losses == losses


@pytest.mark.parametrize("sequence_parallel", [False, True])  # contexts of odd lengths too
def test_gpt_with_activation_checkpointing_and_generate(sequence_parallel):
    results = run_ranks(gpt_checkpointing_and_generate_case, 2, "shm", timeout=60,
                        args=(sequence_parallel,))
    np.testing.assert_array_equal(results[0], results[1])


def test_two_tensor_parallel_groups_in_one_world():
    weights = run_ranks(gpt_subgroups_case, 4, "shm", timeout=60)
    np.testing.assert_array_equal(weights[0], weights[1])
    np.testing.assert_array_equal(weights[2], weights[3])
    assert not np.array_equal(weights[0], weights[2])  # each group trained on its own data
