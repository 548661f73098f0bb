"""Activation checkpointing: the gradients, random stream and hooks of a plain run, less memory.

Every comparison runs the same model twice from the same seed, once through ``checkpoint`` and
once plainly, and asks for equal outputs and gradients (float64 where the model allows).
"""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from dist_harness import run_ranks
from neural_arch import functional as F
from neural_arch.core import Tensor, autograd, get_rng, manual_seed, no_grad
from neural_arch.models import GPT, MLP, GPTConfig
from neural_arch.models.gpt import Block
from neural_arch.nn import Linear, Module, Parameter
from neural_arch.utils.checkpoint import checkpoint

pytestmark = pytest.mark.timeout(120)


def _double(module):
    for p in module.parameters():
        p.array = p.array.astype(np.float64)
    return module


def _grads(module):
    return [None if p.grad is None else p.grad.array.copy() for p in module.parameters()]


def _zero(module, *tensors):
    for t in (*module.parameters(), *tensors):
        t.grad = None


def _assert_same_grads(got, want, rtol=1e-10, atol=1e-12):
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want)):
        assert g is not None and w is not None, f"parameter {i} has no gradient"
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"parameter {i}")


def _run(model, x, ckpt, seed=5, **kwargs):
    """Loss sum(y * y) of model(x) (checkpointed or not) from ``seed``, after backward: the
    output, the input gradient, the parameter gradients and the next random draw."""
    _zero(model, x)
    manual_seed(seed)
    y = checkpoint(model, x, **kwargs) if ckpt else model(x)
    (y * y).sum().backward()
    return y.array.copy(), None if x.grad is None else x.grad.array.copy(), _grads(model), \
        get_rng().random()


@pytest.mark.parametrize("dropout", [0.0, 0.3])
def test_mlp_gradients_equal_the_plain_run(dropout):
    manual_seed(0)
    model = _double(MLP([6, 16, 16, 4], activation="tanh", dropout=dropout))
    x = Tensor(np.random.default_rng(1).standard_normal((5, 6)), requires_grad=True)
    y0, gx0, g0, draw0 = _run(model, x, ckpt=False)
    y1, gx1, g1, draw1 = _run(model, x, ckpt=True)
    np.testing.assert_array_equal(y1, y0)  # same masks: the forward draws are the same
    np.testing.assert_allclose(gx1, gx0, rtol=1e-10, atol=1e-12)
    _assert_same_grads(g1, g0)
    assert draw1 == draw0  # the recompute left no trace on the random stream


def test_without_rng_replay_the_dropout_masks_differ():
    # the replay is what makes the test above pass
    manual_seed(0)
    model = _double(MLP([6, 32, 4], activation="tanh", dropout=0.5))
    x = Tensor(np.random.default_rng(1).standard_normal((8, 6)), requires_grad=True)
    _, _, g0, _ = _run(model, x, ckpt=False)
    _, _, g1, _ = _run(model, x, ckpt=True, preserve_rng_state=False)
    assert not np.allclose(g1[0], g0[0])


def test_rng_stream_after_backward_is_untouched_even_after_reseeding():
    # manual_seed between forward and backward replaces the generator: the recompute replays on
    # the forward's generator and leaves the new one where it was
    manual_seed(0)
    model = _double(MLP([4, 8, 2], activation="tanh", dropout=0.5))
    x = Tensor(np.ones((3, 4)), requires_grad=True)
    _, _, g0, _ = _run(model, x, ckpt=False, seed=9)
    _zero(model, x)
    manual_seed(9)
    y = checkpoint(model, x)
    manual_seed(123)
    (y * y).sum().backward()
    after = get_rng().random()
    _assert_same_grads(_grads(model), g0)
    assert after == np.random.default_rng(123).random()


def test_gpt_block_gradients_equal_the_plain_run():
    manual_seed(0)
    block = _double(Block(GPTConfig(block_size=8, n_embd=16, n_head=2, dropout=0.2)))
    x = Tensor(np.random.default_rng(2).standard_normal((2, 8, 16)), requires_grad=True)
    y0, gx0, g0, draw0 = _run(block, x, ckpt=False)
    y1, gx1, g1, draw1 = _run(block, x, ckpt=True)
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_allclose(gx1, gx0, rtol=1e-10, atol=1e-12)
    _assert_same_grads(g1, g0)
    assert draw1 == draw0


def _gpt_step(checkpointing: bool, training: bool = True):
    config = GPTConfig(block_size=8, vocab_size=11, n_layer=3, n_head=2, n_embd=16, dropout=0.1,
                       gradient_checkpointing=checkpointing)
    manual_seed(0)
    model = _double(GPT(config))
    model.train(training)
    rng = np.random.default_rng(3)
    idx, targets = rng.integers(0, 11, (2, 8)), rng.integers(0, 11, (2, 8))
    manual_seed(7)
    _, loss = model(idx, targets)
    loss.backward()
    return float(loss.item()), _grads(model), get_rng().random()


def test_gpt_with_gradient_checkpointing_equals_without():
    loss0, g0, draw0 = _gpt_step(False)
    loss1, g1, draw1 = _gpt_step(True)
    assert loss1 == loss0
    _assert_same_grads(g1, g0)
    assert draw1 == draw0


def test_gpt_checkpoints_only_when_training_with_grad():
    calls = []
    config = GPTConfig(block_size=4, vocab_size=5, n_layer=2, n_head=1, n_embd=4,
                       gradient_checkpointing=True)
    model = GPT(config)
    original = Block.forward

    def counting(self, x):
        calls.append(x.requires_grad)
        return original(self, x)

    Block.forward = counting
    try:
        idx = np.zeros((1, 4), dtype=np.int64)
        model(idx)  # forward only: each block runs once
        assert len(calls) == 2
        calls.clear()
        model(idx)[0].sum().backward()  # ... and every block but the last once more
        assert len(calls) == 3
        calls.clear()
        model.eval()
        model(idx)[0].sum().backward()
        assert len(calls) == 2
        model.train()
        calls.clear()
        with no_grad():
            model(idx)
        assert len(calls) == 2
    finally:
        Block.forward = original


def test_gradients_reach_parameters_when_no_input_requires_grad():
    manual_seed(0)
    model = _double(MLP([3, 5, 2], activation="tanh"))
    x = Tensor(np.random.default_rng(4).standard_normal((4, 3)))
    _, _, g0, _ = _run(model, x, ckpt=False)
    y = checkpoint(model, x)
    _zero(model)
    assert y.requires_grad and set(y._parents) == set(model.parameters())
    (y * y).sum().backward()
    _assert_same_grads(_grads(model), g0)
    assert x.grad is None


def test_parameter_hooks_fire_once_in_the_outer_backward():
    manual_seed(0)
    model = _double(MLP([3, 4, 2], activation="tanh"))
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    seen = []
    for p in (*model.parameters(), x):
        p.register_post_accumulate_grad_hook(lambda t: seen.append(autograd.current_backward()))
    (checkpoint(model, x) ** 2).sum().backward()
    assert len(seen) == 5 and len(set(seen)) == 1  # one call each, all in the one backward


def test_a_general_callable_finds_the_parameters_it_closes_over():
    manual_seed(0)
    layer = _double(Linear(3, 3))
    scale = Parameter(np.full(3, 0.5))
    x = Tensor(np.random.default_rng(5).standard_normal((2, 3)), requires_grad=True)

    def fn(h, power=1):
        return layer(h).tanh() * scale ** power

    (fn(x, power=2) ** 2).sum().backward()
    want = [layer.weight.grad.array.copy(), layer.bias.grad.array.copy(),
            scale.grad.array.copy(), x.grad.array.copy()]
    for t in (layer.weight, layer.bias, scale, x):
        t.grad = None
    (checkpoint(fn, x, power=2) ** 2).sum().backward()
    _assert_same_grads([layer.weight.grad, layer.bias.grad, scale.grad, x.grad], want)


def test_tuple_outputs_recompute_once():
    manual_seed(0)
    layer = _double(Linear(3, 4))
    calls = []

    def two(h):
        calls.append(1)
        out = layer(h)
        return out.tanh(), "label", out * 2.0

    x = Tensor(np.random.default_rng(6).standard_normal((2, 3)), requires_grad=True)
    a, label, b = two(x)
    ((a * b).sum() + a.sum()).backward()
    want = [layer.weight.grad.array.copy(), layer.bias.grad.array.copy(), x.grad.array.copy()]
    for t in (layer.weight, layer.bias, x):
        t.grad = None
    calls.clear()
    a, label, b = checkpoint(two, x)
    assert label == "label"
    ((a * b).sum() + a.sum()).backward()
    assert len(calls) == 2  # the forward and one recompute for both outputs
    _assert_same_grads([layer.weight.grad, layer.bias.grad, x.grad], want)
    for t in (layer.weight, layer.bias, x):
        t.grad = None
    a, _, b = checkpoint(two, x)
    b.sum().backward()  # only one output used
    np.testing.assert_allclose(x.grad, 2.0 * np.ones((2, 4)) @ layer.weight.array)


def test_under_no_grad_it_just_runs():
    model = MLP([3, 2])
    x = Tensor(np.ones((1, 3)), requires_grad=True)
    with no_grad():
        y = checkpoint(model, x)
    assert not y.requires_grad and y._parents == ()
    np.testing.assert_array_equal(y.array, model(x).array)


class _ReadsAStranger(Module):
    def __init__(self, stranger):
        super().__init__()
        self.layer = Linear(2, 2)
        self.__dict__["stranger"] = stranger  # read, not registered as a parameter

    def forward(self, x):
        return self.layer(x) * self.stranger


def test_errors_name_what_was_passed():
    x = Tensor(np.ones((1, 2)), requires_grad=True)
    with pytest.raises(TypeError, match="must be callable, got int"):
        checkpoint(3, x)
    with pytest.raises(TypeError, match="use_reentrant must be None or a bool, got 'yes'"):
        checkpoint(MLP([2, 2]), x, use_reentrant="yes")
    with pytest.raises(TypeError, match=r"returned list; expected a Tensor or a tuple"):
        checkpoint(lambda h: [h * 2.0], x)
    with pytest.raises(TypeError, match=r"a list argument holds a tensor of shape \(1, 2\)"):
        checkpoint(lambda hs: hs[0] * 2.0, [x])
    y = checkpoint(_ReadsAStranger(Tensor(np.ones(2, dtype=np.float32), requires_grad=True)), x)
    with pytest.raises(RuntimeError, match=r"used a tensor of shape \(2,\) that requires grad "
                                           "but is neither"):
        y.sum().backward()


# ----- memory ----------------------------------------------------------------------------------
class _Residual(Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = Linear(width, 4 * width), Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(self.up(x).tanh())


def _peak_bytes(blocks, x, ckpt: bool) -> int:
    tracemalloc.start()
    try:
        h = x
        for block in blocks:
            h = checkpoint(block, h) if ckpt else block(h)
        (h * h).sum().backward()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_peak_memory_of_a_deep_stack_is_lower():
    manual_seed(0)
    blocks = [_Residual(32) for _ in range(8)]
    x = Tensor(np.random.default_rng(9).standard_normal((256, 32)).astype(np.float32))
    plain = _peak_bytes(blocks, x, ckpt=False)
    for block in blocks:
        _zero(block)
    recomputed = _peak_bytes(blocks, x, ckpt=True)
    # kept without checkpointing: 8 blocks x (two 4x-wide activations + more); with: 8 inputs
    # plus one block's activations
    assert recomputed < 0.5 * plain, (recomputed, plain)


# ----- DistributedDataParallel -----------------------------------------------------------------
class _TwoStages(Module):
    """Two checkpointed MLP stages; the first one's input does not require grad."""

    def __init__(self, recompute: bool):
        super().__init__()
        self.a = MLP([5, 8, 8], activation="tanh")
        self.b = MLP([8, 8, 3], activation="tanh")
        self.recompute = recompute

    def forward(self, x):
        run = checkpoint if self.recompute else (lambda f, h: f(h))
        return run(self.b, run(self.a, x))


def _ddp_data(world_size: int):
    rng = np.random.default_rng(11)
    return rng.standard_normal((3, world_size * 4, 5)), rng.integers(0, 3, (3, world_size * 4))


def _model(recompute: bool):
    manual_seed(21)
    return _double(_TwoStages(recompute))


def _train(model, xs, ys):
    from neural_arch.optim import SGD
    opt = SGD(model.parameters(), lr=0.1)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
        opt.step()


def _ddp_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(_model(recompute=True), bucket_size_mb=0.0002)
    xs, ys = _ddp_data(world_size)
    _train(model, xs[:, rank * 4:(rank + 1) * 4], ys[:, rank * 4:(rank + 1) * 4])
    return [p.array.copy() for p in model.module.parameters()], len(model._buckets)


def test_checkpointed_model_under_ddp_equals_one_process():
    reference = _model(recompute=False)
    _train(reference, *_ddp_data(2))
    results = run_ranks(_ddp_worker, 2, "shm")
    (first, buckets), (second, _) = results
    assert buckets > 1
    for a, b, want in zip(first, second, reference.parameters()):
        assert a.tobytes() == b.tobytes()
        np.testing.assert_allclose(a, want.array, rtol=1e-10, atol=1e-12)


def test_nested_checkpoints_equal_the_plain_run():
    manual_seed(0)
    inner = _double(MLP([4, 6, 4], activation="tanh", dropout=0.2))
    outer_layer = _double(Linear(4, 4))

    class Outer(Module):
        def __init__(self, recompute):
            super().__init__()
            self.inner, self.layer, self.recompute = inner, outer_layer, recompute

        def forward(self, x):
            h = checkpoint(self.inner, x) if self.recompute else self.inner(x)
            return self.layer(h).tanh()

    x = Tensor(np.random.default_rng(12).standard_normal((3, 4)), requires_grad=True)
    y0, gx0, g0, draw0 = _run(Outer(False), x, ckpt=False)
    y1, gx1, g1, draw1 = _run(Outer(True), x, ckpt=True)
    np.testing.assert_array_equal(y1, y0)
    np.testing.assert_allclose(gx1, gx0, rtol=1e-10, atol=1e-12)
    _assert_same_grads(g1, g0)
    assert draw1 == draw0
