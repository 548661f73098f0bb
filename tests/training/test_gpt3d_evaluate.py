"""``GPT3D.evaluate``: the pipeline's forward alone gives the dense GPT's loss of the same
batch, on every rank, before and after a training step, and changes nothing a step uses.

Each mesh is compared with the dense GPT in the test process (float64, same seed): the loss of
an evaluation batch before training, a step's loss, and the evaluation loss after the step."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from gpt3d_cases import SEED, SIZES, dense_gpt
from gpt3d_cases import tokens as _batch

LR = 3e-2


def _dense():
    """(loss of the eval batch, the step's loss, eval loss after the step), one process."""
    from neural_arch.core import no_grad
    from neural_arch.optim import AdamW
    model, params = dense_gpt()
    evaluation, train = _batch(1, 6), _batch(2, 8)

    def evaluate():
        model.eval()
        with no_grad():
            loss = float(model(*evaluation)[1].item())
        model.train()
        return loss
    before = evaluate()
    opt = AdamW(params, lr=LR)
    opt.zero_grad()
    _, loss = model(*train)
    loss.backward()
    opt.step()
    return [before, float(loss.item()), evaluate()]


def _on_mesh(rank, world_size, shape, schedule):
    from neural_arch.core.random import manual_seed
    from neural_arch.distributed import init_device_mesh
    from neural_arch.distributed.parallel3d import GPT3D
    from neural_arch.models.gpt import GPTConfig
    mesh = init_device_mesh(shape, mesh_dim_names=("dp", "tp", "pp"))
    manual_seed(SEED)
    model = GPT3D(GPTConfig(**SIZES), mesh, 2, schedule=schedule, dtype=np.float64, lr=LR)
    # 6 rows: any dp split will do for evaluate, though 6 rows are no 2 x 2 micro-batches
    evaluation, train = _batch(1, 6), _batch(2, 8)
    before = model.evaluate(*evaluation)
    step = model.train_step(*train)
    return [before, step, model.evaluate(*evaluation)], model.steps


@pytest.mark.timeout(200)
@pytest.mark.parametrize("shape,schedule", [((1, 2, 2), "1f1b"), ((2, 1, 2), "interleaved")])
def test_evaluate_equals_the_dense_loss_on_every_rank(shape, schedule):
    dense = _dense()
    for losses, steps in run_ranks(_on_mesh, 4, "shm", timeout=150, args=(shape, schedule)):
        np.testing.assert_allclose(losses, dense, rtol=0, atol=1e-10)
        assert steps == 1  # evaluating is not a step
