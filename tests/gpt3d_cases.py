"""What the GPT3D tests share: the tiny GPT's sizes, its token batches, and the dense GPT they
compare with (built under the runs' seed, in float64)."""
from __future__ import annotations

import numpy as np

SIZES = dict(block_size=8, vocab_size=32, n_layer=4, n_head=2, n_embd=16)
SEED = 7  # every run and its dense reference start from the weights of this seed


def tokens(seed, rows):
    """(idx, targets) of ``rows`` windows of the block size, drawn from ``seed``."""
    rng = np.random.default_rng(seed)
    shape = (rows, SIZES["block_size"])
    return rng.integers(0, SIZES["vocab_size"], shape), rng.integers(0, SIZES["vocab_size"], shape)


def dense_gpt():
    """(the dense GPT of ``SEED`` in float64, its parameters with the tied matrix once)."""
    from neural_arch.core.random import manual_seed
    from neural_arch.models.gpt import GPT, GPTConfig
    manual_seed(SEED)
    model = GPT(GPTConfig(**SIZES))
    params = list({id(p): p for p in model.parameters()}.values())
    for p in params:
        p.array = p.array.astype(np.float64)
    return model, params
