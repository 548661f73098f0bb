"""Learning-rate schedulers and gradient clipping against closed forms (and PyTorch if present)."""
import math

import numpy as np
import pytest

from neural_arch.core.tensor import Tensor
from neural_arch.optim import (SGD, CosineAnnealingLR, LambdaLR, LinearLR, SequentialLR, StepLR,
                               clip_grad_norm_, clip_grad_value_, lr_scheduler)

pytestmark = pytest.mark.timeout(60)

EPOCHS = 25


def Holder(data):
    """A bare parameter: a tensor whose ``.grad`` the tests set by hand (optimizers only
    need ``.array`` and ``.grad``)."""
    return Tensor(np.array(data, dtype=np.float64))


def _optimizer(lr=0.1):
    return SGD([Holder(np.zeros(1))], lr=lr)


def _lrs(scheduler, epochs=EPOCHS):
    """The learning rate before the first step and after each step (ours or torch's)."""
    values = [scheduler.get_last_lr()[0]]
    for _ in range(epochs):
        scheduler.optimizer.step()
        scheduler.step()
        values.append(scheduler.get_last_lr()[0])
    return values


def test_linear_lr_formula():
    sched = LinearLR(_optimizer(0.2), start_factor=0.25, end_factor=0.75, total_iters=8)
    expected = [0.2 * (0.25 + 0.5 * min(e, 8) / 8) for e in range(EPOCHS + 1)]
    np.testing.assert_allclose(_lrs(sched), expected, rtol=1e-12)
    assert LinearLR(_optimizer(0.3)).get_last_lr() == pytest.approx([0.1])  # start_factor 1/3


def test_cosine_formula():
    sched = CosineAnnealingLR(_optimizer(0.5), T_max=10, eta_min=0.01)
    expected = [0.01 + 0.49 * (1 + math.cos(math.pi * e / 10)) / 2 for e in range(EPOCHS + 1)]
    np.testing.assert_allclose(_lrs(sched), expected, rtol=1e-12)


def test_step_and_lambda_formulas():
    np.testing.assert_allclose(_lrs(StepLR(_optimizer(1.0), step_size=3, gamma=0.5)),
                               [0.5 ** (e // 3) for e in range(EPOCHS + 1)])
    np.testing.assert_allclose(_lrs(LambdaLR(_optimizer(2.0), lambda e: 1 / (e + 1))),
                               [2.0 / (e + 1) for e in range(EPOCHS + 1)])


def test_sequential_warmup_then_cosine():
    opt = _optimizer(1.0)
    warmup = LinearLR(opt, start_factor=0.1, total_iters=4)
    cosine = CosineAnnealingLR(opt, T_max=10)
    sched = SequentialLR(opt, [warmup, cosine], milestones=[4])
    expected = [0.1 + 0.9 * e / 4 for e in range(4)]
    expected += [(1 + math.cos(math.pi * e / 10)) / 2 for e in range(EPOCHS + 1 - 4)]
    np.testing.assert_allclose(_lrs(sched), expected, rtol=1e-12, atol=1e-15)
    assert opt.param_groups[0]["lr"] == sched.get_last_lr()[0]


def test_lr_is_written_into_every_group():
    a, b = Holder(np.zeros(1)), Holder(np.zeros(1))
    opt = SGD([{"params": [a], "lr": 1.0}, {"params": [b], "lr": 0.1}], lr=0.5)
    sched = StepLR(opt, step_size=1, gamma=0.5)
    sched.step()
    assert [g["lr"] for g in opt.param_groups] == [0.5, 0.05]
    assert [g["initial_lr"] for g in opt.param_groups] == [1.0, 0.1]


def test_scheduler_state_dict_round_trip():
    opt = _optimizer(1.0)
    sched = SequentialLR(opt, [LinearLR(opt, start_factor=0.5, total_iters=3),
                               CosineAnnealingLR(opt, T_max=6)], milestones=[3])
    for _ in range(4):
        sched.step()
    saved = sched.state_dict()
    assert "optimizer" not in saved and len(saved["_schedulers"]) == 2
    reference = _lrs(sched, 5)

    opt2 = _optimizer(1.0)
    resumed = SequentialLR(opt2, [LinearLR(opt2, start_factor=0.5, total_iters=3),
                                  CosineAnnealingLR(opt2, T_max=6)], milestones=[3])
    resumed.load_state_dict(saved)
    assert resumed.last_epoch == 4
    resumed.step()
    assert resumed.get_last_lr() == pytest.approx([reference[1]])
    assert opt2.param_groups[0]["lr"] == pytest.approx(reference[1])


def test_scheduler_argument_errors():
    opt = _optimizer()
    with pytest.raises(ValueError, match="1.5"):
        LinearLR(opt, start_factor=1.5)
    with pytest.raises(ValueError, match="2 schedulers and 0 milestones"):
        SequentialLR(opt, [StepLR(opt, 2), StepLR(opt, 3)], milestones=[])
    with pytest.raises(ValueError, match="same optimizer"):
        SequentialLR(opt, [StepLR(opt, 2), StepLR(_optimizer(), 3)], milestones=[2])
    with pytest.raises(KeyError, match="initial_lr"):
        StepLR(_optimizer(), 2, last_epoch=3)
    assert lr_scheduler.LRScheduler is not None


TORCH_CASES = [
    ("LinearLR", dict(start_factor=0.2, end_factor=0.9, total_iters=7)),
    ("CosineAnnealingLR", dict(T_max=9, eta_min=0.001)),
    ("StepLR", dict(step_size=4, gamma=0.3)),
]


@pytest.mark.parametrize("name,kwargs", TORCH_CASES)
def test_schedulers_match_torch(name, kwargs):
    torch = pytest.importorskip("torch")
    tparam = torch.nn.Parameter(torch.zeros(1))
    topt = torch.optim.SGD([tparam], lr=0.3)
    tsched = getattr(torch.optim.lr_scheduler, name)(topt, **kwargs)
    ours = getattr(lr_scheduler, name)(_optimizer(0.3), **kwargs)
    np.testing.assert_allclose(_lrs(ours), _lrs(tsched), rtol=1e-9, atol=1e-12)


def test_sequential_matches_torch():
    torch = pytest.importorskip("torch")
    tparam = torch.nn.Parameter(torch.zeros(1))
    topt = torch.optim.SGD([tparam], lr=0.3)
    tsched = torch.optim.lr_scheduler.SequentialLR(
        topt, [torch.optim.lr_scheduler.LinearLR(topt, start_factor=0.1, total_iters=5),
               torch.optim.lr_scheduler.CosineAnnealingLR(topt, T_max=12, eta_min=0.01)],
        milestones=[5])
    opt = _optimizer(0.3)
    ours = SequentialLR(opt, [LinearLR(opt, start_factor=0.1, total_iters=5),
                              CosineAnnealingLR(opt, T_max=12, eta_min=0.01)], milestones=[5])
    np.testing.assert_allclose(_lrs(ours), _lrs(tsched), rtol=1e-9, atol=1e-12)


def _with_grads(grads):
    params = []
    for g in grads:
        p = Holder(np.zeros_like(g))
        p.grad = np.array(g, copy=True)
        params.append(p)
    return params


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, math.inf])
def test_clip_grad_norm_formula(norm_type):
    rng = np.random.default_rng(0)
    grads = [rng.standard_normal((3, 4)), rng.standard_normal(5)]
    flat = np.concatenate([g.ravel() for g in grads])
    if norm_type == math.inf:
        total = np.max(np.abs(flat))
    else:
        total = np.sum(np.abs(flat) ** norm_type) ** (1 / norm_type)
    params = _with_grads(grads)
    result = clip_grad_norm_(params, max_norm=0.5, norm_type=norm_type)
    assert float(result) == pytest.approx(total, rel=1e-12)
    coef = 0.5 / (total + 1e-6)
    for p, g in zip(params, grads):
        np.testing.assert_allclose(p.grad, g * coef, rtol=1e-12)


def test_clip_grad_norm_leaves_small_gradients_untouched():
    grads = [np.array([0.3, -0.4])]
    params = _with_grads(grads)
    assert clip_grad_norm_(params, max_norm=1.0).item() == pytest.approx(0.5)
    np.testing.assert_array_equal(params[0].grad, grads[0])
    none = Holder(np.zeros(2))
    assert clip_grad_norm_([none], 1.0) == 0.0


def test_clip_grad_norm_nonfinite():
    params = _with_grads([np.array([np.inf, 1.0])])
    with pytest.raises(RuntimeError, match="inf"):
        clip_grad_norm_(params, 1.0, error_if_nonfinite=True)


def test_clip_grad_value():
    params = _with_grads([np.array([-3.0, 0.2, 5.0])])
    clip_grad_value_(params, 1.0)
    np.testing.assert_array_equal(params[0].grad, [-1.0, 0.2, 1.0])


def test_clip_grad_norm_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    grads = [rng.standard_normal((4, 4)), rng.standard_normal(7)]
    tparams = [torch.nn.Parameter(torch.zeros(g.shape, dtype=torch.float64)) for g in grads]
    for tp, g in zip(tparams, grads):
        tp.grad = torch.tensor(g)
    expected = torch.nn.utils.clip_grad_norm_(tparams, 1.5).item()
    params = _with_grads(grads)
    assert float(clip_grad_norm_(params, 1.5)) == pytest.approx(expected, rel=1e-12)
    for p, tp in zip(params, tparams):
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), rtol=1e-12)
