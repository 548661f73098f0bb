"""The tensor- and sequence-parallel GPT with dropout > 0 trains exactly as the dense GPT.

Where an activation is split (attention weights by heads; under sequence parallelism the
residual stream by positions) each rank keeps its part of the dense activation's mask
(``tensor_parallel/dropout.py``), and the replicated residual stream draws the dense mask
whole. So from the same state of the global generator, the dense GPT and the parallel one drop
the same elements: each rank runs both from one state for every step and compares the loss,
every gradient (its shard) and, after the AdamW steps, every parameter, in float64; both leave
the generator in the same state. With activation checkpointing on in the parallel model, its
recompute replays the same masks.
"""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from tp_cases import check_param_grads, close, seeded, world
from tp_gpt_cases import GPT_SIZES, _float64, _tokens

pytestmark = pytest.mark.timeout(180)

DROPOUT, STEPS = 0.25, 3


def _train_with_dropout(rank, size, sequence_parallel, checkpointing):
    from neural_arch.core.random import get_rng
    from neural_arch.distributed.tensor_parallel import parallelize_gpt
    from neural_arch.models.gpt import GPT, GPTConfig
    from neural_arch.optim import AdamW
    seeded(21)
    dense = _float64(GPT(GPTConfig(**GPT_SIZES, dropout=DROPOUT)))
    parallel = _float64(parallelize_gpt(GPT(GPTConfig(**GPT_SIZES, dropout=DROPOUT,
                                                      gradient_checkpointing=checkpointing)),
                                        world(), sequence_parallel=sequence_parallel))
    parallel.load_dense_state_dict(dense.state_dict())
    opt_d, opt = AdamW(dense.parameters(), lr=1e-2), AdamW(parallel.parameters(), lr=1e-2)
    tokens = np.random.default_rng(22)
    bits = get_rng().bit_generator
    losses = []
    for step in range(STEPS):
        idx, targets = _tokens(tokens)
        opt.zero_grad()
        opt_d.zero_grad()
        if step == 0:  # without dropout (eval mode draws nothing), to see that it dropped
            parallel.eval()
            without = parallel(idx, targets)[1].item()
            parallel.train()
        start = bits.state
        _, loss_d = dense(idx, targets)
        loss_d.backward()
        after_dense, bits.state = bits.state, start
        _, loss = parallel(idx, targets)
        loss.backward()
        assert bits.state == after_dense, f"step {step}: the models drew different amounts"
        close(loss.item(), loss_d.item(), f"loss of step {step}")
        check_param_grads(parallel, dense, rank, size)
        opt.step()
        opt_d.step()
        losses.append(loss.item())
    state = parallel.dense_state_dict()
    for key, value in dense.state_dict().items():
        close(state[key], value, f"{key} after {STEPS} steps")
    return losses, without


@pytest.mark.parametrize("tp,sequence_parallel,checkpointing",
                         [(2, False, False), (2, True, False), (4, True, False), (4, False, True),
                          (2, True, True)])
def test_gpt_with_dropout_trains_as_the_dense_gpt(tp, sequence_parallel, checkpointing):
    results = run_ranks(_train_with_dropout, tp, "shm", timeout=120,
                        args=(sequence_parallel, checkpointing))
    losses, without = results[0]
    assert all(other == results[0] for other in results[1:])  # one loss on every rank
    assert len(set(losses)) == STEPS, losses
    assert abs(losses[0] - without) > 1e-3, (losses[0], without)  # dropout dropped
