"""Models, data and a dense reference shared by the pipeline tests.

A pipeline run must end where one dense model trained on the whole batch (mean loss) ends: the
same losses and the same parameters, to rounding (float64). ``train_pipeline`` runs on every
rank of a job; ``train_dense`` in the test process; both report parameters by the dense
model's names.
"""
from __future__ import annotations

import numpy as np

WIDTH, PAIRS, BATCH = 10, 8, 24


def make_mlp(seed: int = 0, pairs: int = PAIRS, width: int = WIDTH):
    """``pairs`` x (Linear + Tanh) in float64, initialised from ``seed``."""
    from neural_arch.nn import Linear, Sequential, Tanh
    rng = np.random.default_rng(seed)
    layers = []
    for _ in range(pairs):
        layers += [Linear(width, width, dtype=np.float64), Tanh()]
    model = Sequential(*layers)
    for p in model.parameters():
        p.array[...] = rng.standard_normal(p.array.shape) * 0.5
    return model


def batch(step: int, seed: int = 1, n: int = BATCH, width: int = WIDTH):
    rng = np.random.default_rng(1000 * seed + step)
    return rng.standard_normal((n, width)), rng.standard_normal((n, width))


def mse(out, target):
    from neural_arch import functional as F
    return F.mse_loss(out, target)


def make_optimizer(params, name: str):
    from neural_arch.optim import SGD, AdamW
    if name == "sgd":
        return SGD(params, lr=0.2, momentum=0.5)
    return AdamW(params, lr=0.01, weight_decay=0.1)


def _unique(params):
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


def named(model):
    return {id(p): name for name, p in model.named_parameters()}


def train_dense(model, batches, loss_fn, opt_name: str):
    """Losses and final parameters (by name) of ``model`` trained on whole batches."""
    opt = make_optimizer(_unique(model.parameters()), opt_name)
    losses = []
    for x, y in batches:
        opt.zero_grad()
        out = model(x if not np.issubdtype(np.asarray(x).dtype, np.floating) else _t(x))
        loss = loss_fn(out, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return losses, {name: np.array(p.array) for name, p in model.named_parameters()}


def _t(x):
    from neural_arch.core import Tensor
    return Tensor(x)


def train_pipeline(rank, world_size, model, kind, m, batches, loss_fn, opt_name, v=1):
    """This rank's part of ``model`` trained with schedule ``kind`` on ``m`` micro-batches:
    (mean loss per step on the last rank else None, {name: array} of this rank's parameters,
    the schedule)."""
    from neural_arch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                    ScheduleInterleaved1F1B, pipeline_split)
    names = named(model)
    n_stages = world_size * v
    parts = pipeline_split(model, n_stages)
    stages = [PipelineStage(parts[i], i, n_stages) for i in range(rank, n_stages, world_size)]
    if kind == "gpipe":
        schedule = ScheduleGPipe(stages[0], m, loss_fn)
    elif kind == "1f1b":
        schedule = Schedule1F1B(stages[0], m, loss_fn)
    else:
        schedule = ScheduleInterleaved1F1B(stages, m, loss_fn)
    params = _unique(p for s in stages for p in s.submodule.parameters())
    opt = make_optimizer(params, opt_name)
    first, last = rank == 0, rank == world_size - 1
    step_losses = []
    for x, y in batches:
        opt.zero_grad()
        losses = []
        args = (x,) if first else ()
        schedule.step(*args, target=y if last else None, losses=losses if last else None)
        opt.step()
        if last:
            assert len(losses) == m, (len(losses), m)
            # detached: the list must not keep every micro-batch's graph (activations) alive
            assert all(loss.is_leaf and not loss.requires_grad for loss in losses)
            step_losses.append(float(np.mean([loss.item() for loss in losses])))
    mine = {names[id(p)]: np.array(p.array) for p in params}
    return (step_losses if last else None), mine, schedule


def compare(results, dense_losses, dense_params, tol=1e-10):
    """Merge the ranks' reports and check them against the dense run."""
    losses = [r[0] for r in results if r[0] is not None]
    assert len(losses) == 1
    np.testing.assert_allclose(losses[0], dense_losses, rtol=0, atol=tol)
    merged = {}
    for r in results:
        merged.update(r[1])
    assert set(merged) == set(dense_params), (sorted(merged), sorted(dense_params))
    for name, value in dense_params.items():
        np.testing.assert_allclose(merged[name], value, rtol=0, atol=tol, err_msg=name)


def make_gpt(seed: int = 0, tie: bool = True, checkpointing: bool = False):
    """A tiny GPT (4 blocks, width 16, 2 heads, vocab 32, context 8) in float64."""
    from neural_arch.core.random import manual_seed
    from neural_arch.models.gpt import GPT, GPTConfig
    manual_seed(seed)
    model = GPT(GPTConfig(block_size=8, vocab_size=32, n_layer=4, n_head=2, n_embd=16,
                          tie_weights=tie, gradient_checkpointing=checkpointing))
    for p in _unique(model.parameters()):
        p.array = p.array.astype(np.float64)
    return model


def token_batch(step: int, n: int = 8, t: int = 8, vocab: int = 32):
    rng = np.random.default_rng(500 + step)
    return (rng.integers(0, vocab, (n, t)).astype(np.int64),
            rng.integers(0, vocab, (n, t)).astype(np.int64))


def lm_loss(logits, target):
    from neural_arch import functional as F
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                           np.asarray(target).reshape(-1).astype(np.int64))
