"""The tensor-parallel layers against their dense counterparts, on real processes: forward
outputs and every gradient (inputs and parameters) at tp = 2 and 4, in float64."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from tp_cases import column_case, cross_entropy_case, embedding_case, pair_case, row_case

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


# Per tensor-parallel size: sizes it does not divide (features of a linear layer, rows of an
# embedding, GPT heads), and a GPT whose heads it divides but whose vocabulary it does not.
NOT_DIVIDING = {2: dict(features=5, rows=9, heads=3, head_width=4, gpt_heads=4, gpt_vocab=65),
                3: dict(features=7, rows=10, heads=4, head_width=4, gpt_heads=3, gpt_vocab=64),
                4: dict(features=6, rows=10, heads=3, head_width=4, gpt_heads=4, gpt_vocab=65)}


def _not_dividing_case(rank, tp, sizes):
    """The message of each construction that cannot split over ``tp`` ranks."""
    from neural_arch import distributed as dist
    from neural_arch.distributed.tensor_parallel import (ColumnParallelLinear,
                                                         RowParallelLinear,
                                                         VocabParallelEmbedding,
                                                         parallelize_gpt)
    from neural_arch.models.gpt import GPT, GPTConfig
    group = dist.new_group(list(range(tp)))
    n, width = sizes["features"], 4
    attempts = {
        "column": lambda: ColumnParallelLinear(width, n, group=group),
        "row": lambda: RowParallelLinear(n, width, group=group),
        "embedding": lambda: VocabParallelEmbedding(sizes["rows"], width, group=group),
        "heads": lambda: parallelize_gpt(GPT(GPTConfig(
            n_head=sizes["heads"], vocab_size=64, n_embd=sizes["heads"] * sizes["head_width"])),
            group),
        "vocab": lambda: parallelize_gpt(GPT(GPTConfig(
            n_head=sizes["gpt_heads"], vocab_size=sizes["gpt_vocab"],
            n_embd=sizes["gpt_heads"] * sizes["head_width"])), group)}
    messages = {}
    for name, attempt in attempts.items():
        try:
            attempt()
        except ValueError as exc:
            messages[name] = str(exc)
        else:
            messages[name] = f"no ValueError at tp={tp}"
    return messages


@pytest.mark.parametrize("tp", [2, 3, 4])
def test_sizes_that_do_not_divide_raise_value_error(tp):
    sizes = NOT_DIVIDING[tp]
    for messages in run_ranks(_not_dividing_case, tp, "shm", timeout=60, args=(sizes,)):
        n = sizes["features"]
        assert "ColumnParallelLinear" in messages["column"] and f"({n})" in messages["column"] \
            and f"size {tp}" in messages["column"], messages["column"]
        assert "RowParallelLinear" in messages["row"] and f"in_features ({n})" in messages[
            "row"] and f"size {tp}" in messages["row"], messages["row"]
        assert "VocabParallelEmbedding" in messages["embedding"] and (
            f"num_embeddings ({sizes['rows']})" in messages["embedding"]), messages["embedding"]
        assert f"n_head ({sizes['heads']})" in messages["heads"] and (
            f"size {tp}" in messages["heads"]), messages["heads"]
        assert f"vocab_size ({sizes['gpt_vocab']})" in messages["vocab"] and (
            f"size {tp}" in messages["vocab"]), messages["vocab"]
