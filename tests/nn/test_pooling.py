"""MaxPool2d / AvgPool2d / AdaptiveAvgPool2d and their F. functions against torch."""
import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch import nn
from neural_arch.core import Tensor, gradcheck

pytestmark = pytest.mark.timeout(60)

MAX_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, ceil_mode=True),  # partial last window, no padding
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), dilation=(2, 1), ceil_mode=True),
    dict(kernel_size=3, stride=1, padding=1),  # overlapping windows share maxima
]
AVG_CASES = [
    dict(kernel_size=2),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
    dict(kernel_size=3, stride=2, padding=1, ceil_mode=True, count_include_pad=False),
    dict(kernel_size=(3, 2), stride=(2, 3), padding=(1, 1), ceil_mode=True),
    dict(kernel_size=3, stride=1, padding=1, divisor_override=4),
]
ADAPTIVE_SIZES = [1, (3, 4), (5, None), (7, 9), (4, 2), (10, 12)]


def _compare(torch, ours, theirs, x, tol=1e-12):
    rng = np.random.default_rng(5)
    X = Tensor(x, requires_grad=True)
    tx = torch.tensor(x, requires_grad=True)
    out, ref = ours(X), theirs(tx)
    if isinstance(out, tuple):
        (out, indices), (ref, ref_indices) = out, ref
        np.testing.assert_array_equal(indices.array, ref_indices.numpy())
    gout = rng.standard_normal(out.shape).astype(x.dtype)
    out.backward(gout)
    ref.backward(torch.tensor(gout))
    assert out.shape == tuple(ref.shape) and out.dtype == x.dtype
    np.testing.assert_allclose(out.array, ref.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_allclose(X.grad, tx.grad.numpy(), rtol=tol, atol=tol)


@pytest.mark.parametrize("kwargs", MAX_CASES)
def test_max_pool2d_matches_torch_with_ties_and_indices(kwargs):
    torch = pytest.importorskip("torch")
    # rounded values: many ties, whose gradient must go to the first maximum as in torch
    x = np.round(np.random.default_rng(0).standard_normal((2, 3, 7, 9)) * 2)
    _compare(torch, lambda t: F.max_pool2d(t, **kwargs, return_indices=True),
             lambda t: torch.nn.functional.max_pool2d(t, **kwargs, return_indices=True), x)
    pool = nn.MaxPool2d(**kwargs)
    _compare(torch, pool, torch.nn.MaxPool2d(**kwargs), x[0].astype(np.float32), tol=1e-6)


@pytest.mark.parametrize("kwargs", AVG_CASES)
def test_avg_pool2d_matches_torch(kwargs):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(1).standard_normal((2, 3, 7, 9))
    _compare(torch, lambda t: F.avg_pool2d(t, **kwargs),
             lambda t: torch.nn.functional.avg_pool2d(t, **kwargs), x)
    _compare(torch, nn.AvgPool2d(**kwargs), torch.nn.AvgPool2d(**kwargs),
             x.astype(np.float32), tol=1e-6)


@pytest.mark.parametrize("size", ADAPTIVE_SIZES)
def test_adaptive_avg_pool2d_matches_torch(size):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(2).standard_normal((2, 3, 7, 9))
    _compare(torch, nn.AdaptiveAvgPool2d(size), torch.nn.AdaptiveAvgPool2d(size), x)
    _compare(torch, lambda t: F.adaptive_avg_pool2d(t, size),
             lambda t: torch.nn.functional.adaptive_avg_pool2d(t, size), x[1])


def test_pooling_gradients_against_finite_differences():
    x = Tensor(np.random.default_rng(3).standard_normal((1, 2, 5, 6)), requires_grad=True)
    assert gradcheck(lambda t: F.max_pool2d(t, 3, 2, 1, ceil_mode=True), [x])
    assert gradcheck(lambda t: F.avg_pool2d(t, 3, 2, 1, ceil_mode=True,
                                            count_include_pad=False), [x])
    assert gradcheck(lambda t: F.adaptive_avg_pool2d(t, (4, 4)), [x])


def test_pooling_errors_name_the_values():
    x = np.zeros((1, 2, 6, 6), np.float32)
    with pytest.raises(ValueError, match="at most half"):
        F.max_pool2d(Tensor(x), 2, padding=2)
    with pytest.raises(ValueError, match="too small"):
        F.avg_pool2d(Tensor(x), 7)
    with pytest.raises(ValueError, match=r"\(2, 6\)"):
        F.max_pool2d(Tensor(np.zeros((2, 6), np.float32)), 2)
    with pytest.raises(ValueError, match="output_size"):
        F.adaptive_avg_pool2d(Tensor(x), (0, 2))
    with pytest.raises(ValueError, match="divisor_override"):
        F.avg_pool2d(Tensor(x), 2, divisor_override=0)


@pytest.mark.parametrize("shape,size", [((2, 3, 7, 9), 1), ((2, 3, 8, 9), (2, 3)),
                                        ((3, 16, 32, 32), 1), ((2, 6, 9), (3, 3))])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adaptive_avg_pool2d_over_even_windows_is_torchs_to_the_bit(shape, size, dtype):
    """Windows that tile the input (global pooling among them): the gradient is torch's
    ``grad / window size`` bit for bit, the value its window mean to rounding."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(dtype)
    X, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, ref = F.adaptive_avg_pool2d(X, size), torch.nn.functional.adaptive_avg_pool2d(tx, size)
    gout = rng.standard_normal(out.shape).astype(dtype)
    out.backward(gout)
    ref.backward(torch.tensor(gout))
    assert out.shape == tuple(ref.shape) and out.dtype == dtype and X.grad.dtype == dtype
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(out.array, ref.detach().numpy(), rtol=tol, atol=tol)
    np.testing.assert_array_equal(X.grad.array, tx.grad.numpy())
