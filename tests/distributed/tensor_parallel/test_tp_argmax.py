"""``tensor_parallel.argmax.vocab_parallel_argmax``: from each rank's vocabulary shard, the
argmax of the gathered logits, equal maxima on several ranks included (the lowest global index
wins, as ``np.argmax``); and the tensor-parallel GPT's ``predicted_tokens`` is the dense GPT's
argmax."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from tp_gpt_cases import _gpt_pair, _tokens

pytestmark = pytest.mark.timeout(60)


def _argmax_case(rank, size):
    from neural_arch.distributed.tensor_parallel.argmax import vocab_parallel_argmax
    per_rank = 4
    logits = np.random.default_rng(5).normal(size=(3, 5, per_rank * size)).astype(np.float32)
    # ties: row 0 has its maximum on every rank, row 1 twice on the last rank only
    logits[0, 0, :] = 0.0
    logits[0, 0, per_rank - 1::per_rank] = 9.0
    logits[0, 1, -1] = logits[0, 1, -3] = 9.0
    shard = logits[..., rank * per_rank:(rank + 1) * per_rank]
    got = vocab_parallel_argmax(shard)
    return got, logits.argmax(axis=-1)


@pytest.mark.parametrize("tp", [2, 3])
def test_split_argmax_is_the_gathered_argmax_ties_included(tp):
    results = run_ranks(_argmax_case, tp, "shm", timeout=45)
    for got, want in results:
        assert got.shape == want.shape and got.dtype.kind == "i"
        np.testing.assert_array_equal(got, want)
    assert results[0][1][0, 0] == 3  # the tie on every rank: the lowest global index


def _gpt_case(rank, size):
    dense, parallel = _gpt_pair(31)
    idx, _ = _tokens(np.random.default_rng(32))
    dense_ids = dense(idx)[0].array.argmax(axis=-1)
    return parallel.predicted_tokens(parallel(idx)[0]), dense_ids


def test_tensor_parallel_gpt_predicts_the_dense_gpts_tokens():
    for got, want in run_ranks(_gpt_case, 2, "shm", timeout=45):
        np.testing.assert_array_equal(got, want)
