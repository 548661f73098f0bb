"""Gradient clipping on a dp x tp x pp mesh clips by the norm of the whole model's gradient.

GPT3D with ``max_grad_norm`` against the dense GPT (float64, AdamW) clipped by
``optim.clip_grad_norm_`` after each backward: the norm before clipping of every step, the
losses and every parameter at the end. The limit is well below the gradients' norm, so every
step clips; a norm counted per shard or per stage (each rank its own part), or with a
replicated LayerNorm or the tied embedding counted more than once, differs from the dense one.
"""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from gpt3d_cases import SEED, SIZES, dense_gpt, tokens

STEPS, BATCH, LR, MAX_NORM = 3, 8, 3e-2, 0.05


def _batch(step):
    return tokens(100 + step, BATCH)


def _dense_clipped():
    from neural_arch.optim import AdamW, clip_grad_norm_
    model, params = dense_gpt()
    opt = AdamW(params, lr=LR)
    losses, norms = [], []
    for s in range(STEPS):
        x, y = _batch(s)
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        norms.append(float(clip_grad_norm_(params, MAX_NORM)))
        opt.step()
        losses.append(float(loss.item()))
    return model.state_dict(), losses, norms


def _train_clipped(rank, world_size, shape, schedule, micro, parent):
    from neural_arch.core.random import manual_seed
    from neural_arch.distributed import init_device_mesh
    from neural_arch.distributed.parallel3d import GPT3D
    from neural_arch.models.gpt import GPTConfig
    mesh = init_device_mesh(shape, mesh_dim_names=("dp", "tp", "pp"))
    manual_seed(SEED)
    model = GPT3D(GPTConfig(**SIZES), mesh, micro, schedule=schedule, dtype=np.float64,
                  max_grad_norm=MAX_NORM, lr=LR)
    losses, norms = [], []
    for s in range(STEPS):
        losses.append(model.train_step(*_batch(s)))
        norms.append(model.grad_norm)
    return dict(losses=losses, norms=norms, final=model.save(parent, "final"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("shape, schedule, micro", [
    ((1, 2, 2), "1f1b", 2),  # tp shards and replicated LayerNorms; the embedding tied over pp
    ((2, 1, 2), "interleaved", 2),  # dp replicas; 4 stages on 2 ranks, tied over ranks
])
def test_clipping_matches_the_dense_gpt_clipped(tmp_path, shape, schedule, micro):
    from neural_arch.distributed.parallel3d import load_dense_checkpoint
    reference, dense_losses, dense_norms = _dense_clipped()
    assert min(dense_norms) > 4 * MAX_NORM  # every step clips
    results = run_ranks(_train_clipped, 4, "shm", timeout=200,
                        args=(shape, schedule, micro, str(tmp_path)))
    for r in results:
        np.testing.assert_allclose(r["norms"], dense_norms, rtol=1e-10, atol=0)
        np.testing.assert_allclose(r["losses"], dense_losses, rtol=0, atol=1e-10)
    _, state = load_dense_checkpoint(results[0]["final"])
    for key, value in reference.items():
        np.testing.assert_allclose(state[key], value, rtol=0, atol=1e-10, err_msg=key)
