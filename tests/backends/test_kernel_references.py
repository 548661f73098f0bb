"""The float64 kernel references (what every CUDA kernel must compute), checked on the CPU.

Each reference is compared with the framework's autograd (``F.gelu``, ``F.cross_entropy``,
``F.layer_norm``, ``optim.AdamW``) and, for the backward passes, with central finite
differences of the reference's own forward, so the GPU tests compare against trusted values.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.backends.kernels import reference as R
from neural_arch.core import Tensor
from neural_arch.optim import AdamW

pytestmark = pytest.mark.timeout(60)


def _rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def _numeric_vjp(fn, x: np.ndarray, weights: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """d/dx of sum(weights * fn(x)) by central differences, element by element."""
    grad = np.zeros_like(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        up = float((weights * fn(x)).sum())
        x[i] = saved - eps
        down = float((weights * fn(x)).sum())
        x[i] = saved
        grad[i] = (up - down) / (2 * eps)
    return grad


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_matches_autograd_and_finite_differences(approximate):
    rng = _rng(1)
    x = rng.standard_normal((3, 4, 6)) * 2.0
    bias = rng.standard_normal(6)
    upstream = rng.standard_normal(x.shape)
    xt, bt = Tensor(x.copy(), requires_grad=True), Tensor(bias.copy(), requires_grad=True)
    out = F.gelu(xt + bt, approximate=approximate)
    (out * Tensor(upstream)).sum().backward()
    forward = R.bias_gelu_forward(x, bias, approximate)
    np.testing.assert_allclose(forward, out.array, rtol=1e-12, atol=1e-13)
    gx, gb = R.bias_gelu_backward(upstream, x, bias, approximate)
    np.testing.assert_allclose(gx, xt.grad, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(gb, bt.grad, rtol=1e-10, atol=1e-12)
    numeric = _numeric_vjp(lambda v: R.bias_gelu_forward(v, bias, approximate), x.copy(),
                           upstream)
    np.testing.assert_allclose(gx, numeric, rtol=1e-6, atol=1e-8)


def test_gelu_closed_form_points():
    points = np.array([0.0, 1.0, -1.0, 3.0])
    exact = [0.5 * v * (1 + math.erf(v / math.sqrt(2))) for v in points]
    np.testing.assert_allclose(R.bias_gelu_forward(points), exact, rtol=1e-15, atol=1e-16)
    grad, grad_bias = R.bias_gelu_backward(np.ones(4), points)
    assert grad_bias is None
    assert grad[0] == pytest.approx(0.5)  # Phi(0) + 0 * phi(0)


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_matches_autograd(smoothing):
    rng = _rng(2)
    logits = rng.standard_normal((7, 5)) * 4.0
    target = np.array([0, 4, -100, 2, 2, 1, -100])
    upstream = rng.standard_normal(7)
    zt = Tensor(logits.copy(), requires_grad=True)
    loss = F.cross_entropy(zt, target, reduction="none", label_smoothing=smoothing)
    (loss * Tensor(upstream)).sum().backward()
    rows, lse = R.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    np.testing.assert_allclose(rows, loss.array, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(logits).sum(axis=1)), rtol=1e-13)
    grad = R.cross_entropy_backward(upstream, logits, target, lse, label_smoothing=smoothing)
    np.testing.assert_allclose(grad, zt.grad, rtol=1e-10, atol=1e-12)
    assert not grad[2].any() and rows[2] == 0.0  # ignored rows carry nothing
    numeric = _numeric_vjp(lambda v: R.cross_entropy_forward(v, target, -100, smoothing)[0],
                           logits.copy(), upstream)
    np.testing.assert_allclose(grad, numeric, rtol=1e-6, atol=1e-8)


def test_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1000.0, 0.0, -1000.0], [-5e4, -5e4, -5e4]])
    rows, lse = R.cross_entropy_forward(logits, np.array([0, 1]))
    np.testing.assert_allclose(rows, [0.0, math.log(3.0)], atol=1e-12)
    assert np.isfinite(lse).all()


def test_cross_entropy_rejects_bad_targets():
    logits = np.zeros((2, 3))
    with pytest.raises(ValueError, match="target value 3 is out of range for 3 classes"):
        R.cross_entropy_forward(logits, np.array([0, 3]))
    with pytest.raises(ValueError, match=r"target has shape \(3,\), expected \(2,\)"):
        R.cross_entropy_forward(logits, np.array([0, 1, 2]))
    with pytest.raises(TypeError, match="integer class indices"):
        R.cross_entropy_forward(logits, np.array([0.0, 1.0]))


def test_layer_norm_matches_autograd_and_finite_differences():
    rng = _rng(3)
    x = rng.standard_normal((2, 3, 8)) * 3.0 + 1.5
    weight, bias = rng.standard_normal(8), rng.standard_normal(8)
    upstream = rng.standard_normal(x.shape)
    ts = [Tensor(a.copy(), requires_grad=True) for a in (x, weight, bias)]
    out = F.layer_norm(ts[0], 8, ts[1], ts[2], eps=1e-5)
    (out * Tensor(upstream)).sum().backward()
    y, mean, rstd = R.layer_norm_forward(x, weight, bias, 1e-5)
    np.testing.assert_allclose(y, out.array, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(mean, x.reshape(6, 8).mean(axis=1), rtol=1e-13)
    np.testing.assert_allclose(rstd, 1 / np.sqrt(x.reshape(6, 8).var(axis=1) + 1e-5), rtol=1e-12)
    grads = R.layer_norm_backward(upstream, x, weight, mean, rstd)
    for got, tensor in zip(grads, ts):
        np.testing.assert_allclose(got, tensor.grad, rtol=1e-9, atol=1e-11)
    numeric = _numeric_vjp(lambda v: R.layer_norm_forward(v, weight, bias, 1e-5)[0], x.copy(),
                           upstream)
    np.testing.assert_allclose(grads[0], numeric, rtol=1e-5, atol=1e-7)


def test_layer_norm_without_affine_parameters():
    x = _rng(4).standard_normal((5, 4))
    y, mean, rstd = R.layer_norm_forward(x)
    np.testing.assert_allclose(y.mean(axis=1), 0.0, atol=1e-13)
    # mean(y^2) = var / (var + eps) = 1 - eps * rstd^2
    np.testing.assert_allclose((y * y).mean(axis=1), 1 - 1e-5 * rstd ** 2, rtol=1e-12)
    dx, dw, db = R.layer_norm_backward(np.ones_like(x), x, None, mean, rstd)
    np.testing.assert_allclose(dx, 0.0, atol=1e-12)  # a constant upstream normalises away
    np.testing.assert_allclose(db, 5.0)


@pytest.mark.parametrize("maximize", [False, True])
def test_adamw_reference_matches_optimizer(maximize):
    rng = _rng(5)
    shapes = [(4, 3), (7,), (2, 2, 2)]
    params = [Tensor(rng.standard_normal(s), requires_grad=True) for s in shapes]
    mine = [p.array.copy() for p in params]
    avgs, avg_sqs = [np.zeros(s) for s in shapes], [np.zeros(s) for s in shapes]
    hyper = dict(lr=0.01, betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
    optimizer = AdamW(params, maximize=maximize, **hyper)
    for step in range(1, 5):
        grads = [rng.standard_normal(s) for s in shapes]
        for p, g in zip(params, grads):
            p.grad = g.copy()
        optimizer.step()
        R.adamw_step(mine, grads, avgs, avg_sqs, step=step, lr=0.01, beta1=0.8, beta2=0.95,
                     eps=1e-6, weight_decay=0.1, maximize=maximize)
        for p, m in zip(params, mine):
            np.testing.assert_allclose(m, p.array, rtol=1e-13, atol=1e-15)


def test_adamw_first_step_closed_form():
    # After one step from zero state: m = (1-b1) g, v = (1-b2) g^2; bias correction makes the
    # update lr * g / (|g| + eps) on top of the decay.
    p, g = np.array([1.0, -2.0]), np.array([0.5, -4.0])
    m, v = np.zeros(2), np.zeros(2)
    R.adamw_step([p], [g], [m], [v], step=1, lr=0.1, beta1=0.9, beta2=0.99, eps=1e-8,
                 weight_decay=0.5)
    expected = np.array([1.0, -2.0]) * (1 - 0.05) - 0.1 * g / (np.abs(g) + 1e-8)
    np.testing.assert_allclose(p, expected, rtol=1e-12)
    np.testing.assert_allclose(m, 0.1 * g, rtol=1e-12)
    np.testing.assert_allclose(v, 0.01 * g * g, rtol=1e-12)


def test_adamw_reference_rejects_mismatched_lists():
    with pytest.raises(ValueError, match="tensor lists differ in length"):
        R.adamw_step([np.zeros(2)], [], [np.zeros(2)], [np.zeros(2)], step=1, lr=0.1,
                     beta1=0.9, beta2=0.9, eps=1e-8, weight_decay=0.0)
    with pytest.raises(ValueError, match="mismatched shapes"):
        R.adamw_step([np.zeros(2)], [np.zeros(3)], [np.zeros(2)], [np.zeros(2)], step=1,
                     lr=0.1, beta1=0.9, beta2=0.9, eps=1e-8, weight_decay=0.0)
    with pytest.raises(ValueError, match="step must be an integer >= 1"):
        R.adamw_step([], [], [], [], step=0, lr=0.1, beta1=0.9, beta2=0.9, eps=1e-8,
                     weight_decay=0.0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_unscale_reference(dtype):
    grads = [np.array([2.0, -4.0, 8.0], dtype=dtype), np.array([[1.0, 3.0]], dtype=dtype)]
    flag = R.unscale_and_check_inf(grads, 0.25)
    assert flag.dtype == np.float32 and flag[0] == 0.0
    np.testing.assert_array_equal(grads[0], np.array([0.5, -1.0, 2.0], dtype=dtype))
    bad = [np.array([1.0, np.inf], dtype=dtype), np.array([np.nan], dtype=dtype)]
    flag = R.unscale_and_check_inf(bad[:1], 0.5, found_inf=flag)
    assert flag[0] == 1.0 and bad[0][0] == 0.5
    flag2 = R.unscale_and_check_inf(bad[1:], 0.5)
    assert flag2[0] == 1.0 and np.isnan(bad[1][0])
    with pytest.raises(TypeError, match="gradient 0 has dtype float64"):
        R.unscale_and_check_inf([np.zeros(2)], 1.0)
