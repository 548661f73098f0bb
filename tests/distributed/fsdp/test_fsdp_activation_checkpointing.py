"""FullyShardedDataParallel with activation checkpointing: each checkpointed block is an FSDP
unit, so its recompute during backward runs the unit's forward again; training must equal the
same job without checkpointing."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(180)


def _train(rank, world_size, checkpointing, strategy):
    from neural_arch.core import manual_seed
    from neural_arch.distributed.fsdp import FullyShardedDataParallel, ModuleWrapPolicy
    from neural_arch.models.gpt import GPT, Block, GPTConfig
    from neural_arch.optim import Adam
    manual_seed(3)
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=16,
                          dropout=0.1, gradient_checkpointing=checkpointing))
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    fsdp = FullyShardedDataParallel(model, sharding_strategy=strategy,
                                    auto_wrap_policy=ModuleWrapPolicy({Block}))
    optimizer = Adam(fsdp.parameters(), lr=0.01)
    rng = np.random.default_rng(rank)
    manual_seed(100 + rank)  # dropout masks: the same draws with and without checkpointing
    for _ in range(3):
        x, y = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
        optimizer.zero_grad()
        fsdp(x, y)[1].backward()
        optimizer.step()
    return fsdp.full_state_dict(), fsdp.memory_stats()["gathered_bytes"]


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_checkpointed_blocks_as_units_train_as_without(strategy):
    plain = run_ranks(_train, 2, "shm", args=(False, strategy))
    checkpointed = run_ranks(_train, 2, "shm", args=(True, strategy))
    for (want, _), (got, gathered) in zip(plain, checkpointed):
        for key in want:
            np.testing.assert_allclose(got[key], want[key], rtol=1e-10, atol=1e-12, err_msg=key)
        if strategy == "FULL_SHARD":
            assert gathered == 0  # the recompute's gathers were freed too
