"""Tensor- and sequence-parallel GPT with dropout > 0 against the dense GPT given the same masks.

Dropout draws its mask from the global generator, in step on every rank
(``tensor_parallel/sequence.py``, ``tensor_parallel/gpt.py``): a dense GPT's draws cannot be
compared with the parallel one's, which are smaller. What is defined, and tested here: each
rank records the uniforms its dropouts draw; the dense GPT then replays the masks the ranks
used, put together as the layout says (attention weights: each rank's heads; the residual
stream under sequence parallelism: each rank's positions; without it the residual stream is
replicated, so every rank must have drawn the same mask, which is checked). With those masks the
parallel GPT trains as the dense one: every loss, every gradient and, after the AdamW steps,
every parameter, in float64.

Under sequence parallelism nothing needs the ranks' masks to agree: it trains as the dense GPT
with generators out of step too. (In step, as they are, the ranks' positions share one dropout
pattern, a limit ``docs/tensor-parallel.md`` names; Megatron-LM draws them from a generator
seeded per tensor-parallel rank.)
"""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from dist_harness import run_ranks
from tp_cases import check_param_grads, close, seeded, world
from tp_gpt_cases import GPT_SIZES, _float64, _tokens

pytestmark = pytest.mark.timeout(180)

DROPOUT, STEPS = 0.25, 3


class _Recording:
    """The generator, keeping a copy of every array of uniforms drawn from it."""

    def __init__(self, generator):
        self.generator, self.draws = generator, []

    def random(self, shape, dtype):
        drawn = self.generator.random(shape, dtype=dtype)
        self.draws.append(np.array(drawn))
        return drawn


class _Replaying:
    """Hands out the given arrays of uniforms, in order, each checked against the request."""

    def __init__(self, draws):
        self.draws = list(draws)

    def random(self, shape, dtype):
        assert self.draws, f"the dense GPT drew more often than the parallel one ({shape})"
        drawn = self.draws.pop(0)
        assert drawn.shape == tuple(shape) and drawn.dtype == np.dtype(dtype), (
            drawn.shape, drawn.dtype, shape, dtype)
        return drawn


@contextlib.contextmanager
def _dropout_draws_from(generator):
    from neural_arch.core import fused_layers  # dropout's module: it asks it for the generator
    original = fused_layers.get_rng
    fused_layers.get_rng = lambda: generator
    try:
        yield generator
    finally:
        fused_layers.get_rng = original


def _dense_draws(per_rank, sequence_parallel):
    """The dense GPT's uniforms from each rank's (the same number and order of draws)."""
    assert len({len(draws) for draws in per_rank}) == 1, [len(d) for d in per_rank]
    dense = []
    for pieces in zip(*per_rank):
        if pieces[0].ndim == 4 or sequence_parallel:
            # attention weights (batch, heads, T, T): each rank's heads, in rank order; the
            # residual stream (batch, T, C) under sequence parallelism: each rank's positions
            dense.append(np.concatenate(pieces, axis=1))
        else:  # the replicated residual stream: the ranks must have dropped the same elements
            for piece in pieces[1:]:
                np.testing.assert_array_equal(piece, pieces[0])
            dense.append(pieces[0])
    return dense


def _train_with_dropout(rank, size, sequence_parallel, out_of_step):
    from neural_arch import distributed as dist
    from neural_arch.core.random import get_rng
    from neural_arch.models.gpt import GPT, GPTConfig
    from neural_arch.optim import AdamW
    config = GPTConfig(**GPT_SIZES, dropout=DROPOUT)
    seeded(21)
    dense = _float64(GPT(config))
    parallel = _float64(GPT(config, tp_group=world(), sequence_parallel=sequence_parallel))
    parallel.load_dense_state_dict(dense.state_dict())
    opt_d, opt = AdamW(dense.parameters(), lr=1e-2), AdamW(parallel.parameters(), lr=1e-2)
    tokens = np.random.default_rng(22)
    if out_of_step:  # rank r's dropouts draw from r uniforms further on
        get_rng().random(rank)
    losses, dropped = [], []
    for step in range(STEPS):
        idx, targets = _tokens(tokens)
        opt.zero_grad()
        opt_d.zero_grad()
        with _dropout_draws_from(_Recording(get_rng())) as recording:
            _, loss = parallel(idx, targets)
        loss.backward()
        # embedding dropout, then per block attention weights, attention and MLP outputs
        assert len(recording.draws) == 1 + 3 * GPT_SIZES["n_layer"], len(recording.draws)
        draws = _dense_draws(dist.all_gather_object(recording.draws), sequence_parallel)
        dropped.append(float(np.mean(np.concatenate([d.ravel() for d in draws]) < DROPOUT)))
        with _dropout_draws_from(_Replaying(draws)) as replaying:
            _, loss_d = dense(idx, targets)
        assert not replaying.draws, f"{len(replaying.draws)} draws left over"
        loss_d.backward()
        close(loss.item(), loss_d.item(), f"loss of step {step}")
        check_param_grads(parallel, dense, rank, size)
        opt.step()
        opt_d.step()
        losses.append(loss.item())
    state = parallel.dense_state_dict()
    for key, value in dense.state_dict().items():
        close(state[key], value, f"{key} after {STEPS} steps")
    return losses, dropped


@pytest.mark.parametrize("tp,sequence_parallel,out_of_step",
                         [(2, False, False), (2, True, False), (4, True, False), (2, True, True)])
def test_gpt_with_dropout_trains_as_dense_with_the_same_masks(tp, sequence_parallel,
                                                               out_of_step):
    results = run_ranks(_train_with_dropout, tp, "shm", timeout=120,
                        args=(sequence_parallel, out_of_step))
    losses, dropped = results[0]
    for other in results[1:]:
        assert other == results[0]  # one loss on every rank, and the same dense masks
    assert all(0.15 < share < 0.35 for share in dropped), dropped  # dropout did drop
    assert len(set(losses)) == STEPS, losses
