"""Batch norm's compiled per-channel kernels against the NumPy form and torch: values, input /
weight / bias gradients and running statistics, float32 and float64, odd shapes, the
statistics and gradient-sum seams."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch import nn
from neural_arch.backends import batchnorm_kernels as kernels
from neural_arch.core import Tensor, ops_batchnorm

pytestmark = [pytest.mark.timeout(60), pytest.mark.skipif(
    not kernels.available(), reason="Numba is not installed or is switched off")]

SHAPES = [(2, 3, 4, 5), (5, 4, 7), (3, 2, 1, 1), (7, 16, 9, 11)]
TOL = {np.float32: 2e-5, np.float64: 1e-11}


def use(monkeypatch, form: str) -> None:
    monkeypatch.setattr(ops_batchnorm, "_kernels", kernels if form == "kernels" else False)


def run(shape, dtype, affine=True, seed=0):
    """(out, x.grad, [weight.grad, bias.grad], running mean, running var) of one training
    step of BatchNorm over ``shape`` (1d or 2d by rank)."""
    rng = np.random.default_rng(seed)
    layer = (nn.BatchNorm2d if len(shape) == 4 else nn.BatchNorm1d)(shape[1], affine=affine,
                                                                     dtype=dtype)
    if affine:
        layer.weight.array[...] = rng.uniform(0.5, 1.5, shape[1])
        layer.bias.array[...] = rng.standard_normal(shape[1])
    x = Tensor((rng.standard_normal(shape) * 3 + 2).astype(dtype), requires_grad=True)
    out = layer(x)
    out.backward(rng.standard_normal(shape).astype(dtype))
    params = [layer.weight.grad, layer.bias.grad] if affine else []
    return [out.array, x.grad, *params, layer.running_mean.array, layer.running_var.array]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("affine", [True, False])
def test_kernels_match_the_numpy_form(monkeypatch, shape, dtype, affine):
    use(monkeypatch, "numpy")
    want = run(shape, dtype, affine)
    use(monkeypatch, "kernels")
    got = run(shape, dtype, affine)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype == dtype
        np.testing.assert_allclose(g, w, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (9, 5, 13)])
def test_kernels_match_torch_float64(monkeypatch, shape):
    torch = pytest.importorskip("torch")
    use(monkeypatch, "kernels")
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape) * 2 + 1
    g = rng.standard_normal(shape)
    w, b = rng.uniform(0.5, 1.5, shape[1]), rng.standard_normal(shape[1])
    X, W, B = (Tensor(a, requires_grad=True) for a in (x, w, b))
    mean, var = Tensor(np.zeros(shape[1])), Tensor(np.ones(shape[1]))
    out = F.batch_norm(X, mean, var, W, B, training=True, momentum=0.2)
    out.backward(g)
    tx, tw, tb = (torch.tensor(a, requires_grad=True) for a in (x, w, b))
    tmean, tvar = torch.zeros(shape[1], dtype=torch.float64), torch.ones(shape[1],
                                                                         dtype=torch.float64)
    ref = torch.nn.functional.batch_norm(tx, tmean, tvar, tw, tb, training=True, momentum=0.2)
    ref.backward(torch.tensor(g))
    for ours, theirs in ((out.array, ref), (X.grad, tx.grad), (W.grad, tw.grad),
                         (B.grad, tb.grad), (mean.array, tmean), (var.array, tvar)):
        np.testing.assert_allclose(ours, theirs.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_float32_resnet_sized_channel_keeps_accuracy(monkeypatch):
    """A channel of 64 * 32 * 32 float32 values with a large mean: float64 across rows."""
    use(monkeypatch, "kernels")
    x = (np.random.default_rng(2).standard_normal((64, 2, 32, 32)) + 100).astype(np.float32)
    mean, var = kernels.statistics(x)
    want = x.astype(np.float64)
    np.testing.assert_allclose(mean, want.mean(axis=(0, 2, 3)), rtol=1e-6)
    np.testing.assert_allclose(var, want.var(axis=(0, 2, 3)), rtol=1e-4)


def test_seams_still_run_with_kernels(monkeypatch):
    """A subclass's statistics and gradient sums are used (here: doubled sums), and the result
    equals the NumPy form's with the same seams."""
    class Doubled(nn.BatchNorm2d):
        def _batch_statistics(self, data, axes):
            mean, var, count = super()._batch_statistics(data, axes)
            return mean + 1, var * 2, count

        def _reduce_gradient_sums(self, sums):
            return sums * 2

    def step():
        layer = Doubled(3)
        x = Tensor(np.random.default_rng(3).standard_normal((4, 3, 5, 5)).astype(np.float32),
                   requires_grad=True)
        out = layer(x)
        (out * out).sum().backward()
        return out.array, x.grad, layer.weight.grad

    use(monkeypatch, "numpy")
    want = step()
    use(monkeypatch, "kernels")
    for g, w in zip(step(), want):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)


def test_non_contiguous_and_mixed_dtypes_take_the_numpy_form():
    x = np.zeros((4, 3, 5, 5), np.float32)
    assert ops_batchnorm.channel_kernels(x) is kernels
    assert ops_batchnorm.channel_kernels(x.transpose(0, 1, 3, 2)) is None
    assert ops_batchnorm.channel_kernels(x, np.ones(3, np.float64)) is None
    assert ops_batchnorm.channel_kernels(x.astype(np.float16)) is None
    assert ops_batchnorm.channel_kernels(np.zeros((4, 3), np.float32)) is None
