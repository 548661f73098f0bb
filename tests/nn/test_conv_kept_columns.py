"""A convolution whose input needs no gradient (a first layer) on NumPy takes the kept columns
of ``core.conv_kept_columns`` (the bias as a row of ones in the same product): values and
weight / bias gradients against torch, with and without bias, a frozen weight, strides,
dilation, no padding, conv1d; grouped ones keep the general whole-batch columns."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch.core import Tensor, conv_cpu, conv_kept_columns, ops_conv

pytestmark = pytest.mark.timeout(60)

# (channels in, out, kernel, stride, padding, dilation, image (h, w))
CASES = [
    (3, 16, (3, 3), 1, 1, 1, (9, 7)),        # the stem of an image network
    (3, 8, (5, 5), 2, 2, 1, (11, 10)),       # a strided stem
    (2, 4, (3, 2), 1, 0, 2, (8, 9)),         # dilated, no padding, non-square kernel
    (1, 3, (1, 1), 1, 0, 1, (4, 5)),         # 1x1
    (2, 3, (3, 3), 1, 3, 1, (4, 4)),         # padding wider than the kernel
    (3, 4, (3, 3), (2, 1), 1, (1, 2), (9, 8)),  # strided in height only, dilated in width
]


def _route_only_through_kept_columns(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a convolution without an input gradient left the kept columns")
    monkeypatch.setattr(ops_conv, "im2col", refuse)
    monkeypatch.setattr(conv_cpu, "forward", refuse)
    monkeypatch.setattr(conv_cpu, "backward", refuse)


def _compare(torch, x, w, b, conv_args, need, tol, spatial=2):
    X = Tensor(x)
    W, B = Tensor(w, requires_grad="w" in need), \
        None if b is None else Tensor(b, requires_grad="b" in need)
    ours = F.conv2d if spatial == 2 else F.conv1d
    out = ours(X, W, B, *conv_args)
    gout = np.random.default_rng(9).standard_normal(out.shape).astype(x.dtype)
    out.backward(gout)
    tw = torch.tensor(w, requires_grad="w" in need)
    tb = None if b is None else torch.tensor(b, requires_grad="b" in need)
    theirs = torch.nn.functional.conv2d if spatial == 2 else torch.nn.functional.conv1d
    ref = theirs(torch.tensor(x), tw, tb, *conv_args)
    ref.backward(torch.tensor(gout))
    assert out.dtype == x.dtype and out.shape == tuple(ref.shape) and X.grad is None
    np.testing.assert_allclose(out.array, ref.detach().numpy(), rtol=tol, atol=tol)
    for name, ours_param, their_param in (("w", W, tw), ("b", B, tb)):
        if name in need and ours_param is not None:
            assert ours_param.grad.dtype == x.dtype, name
            np.testing.assert_allclose(ours_param.grad.array, their_param.grad.numpy(),
                                       rtol=tol, atol=tol, err_msg=name)
        elif ours_param is not None:
            assert ours_param.grad is None, name


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,tol,need,bias", [
    (np.float64, 1e-10, "wb", True), (np.float64, 1e-10, "w", False),
    (np.float64, 1e-10, "b", True), (np.float64, 1e-10, "w", True),
    (np.float32, 3e-4, "wb", True)])
def test_first_layer_matches_torch_through_kept_columns(monkeypatch, case, dtype, tol, need,
                                                        bias):
    torch = pytest.importorskip("torch")
    _route_only_through_kept_columns(monkeypatch)
    cin, cout, kernel, stride, padding, dilation, image = case
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, cin) + image).astype(dtype)
    w = rng.standard_normal((cout, cin) + kernel).astype(dtype)
    b = rng.standard_normal(cout).astype(dtype) if bias else None
    _compare(torch, x, w, b, (stride, padding, dilation, 1), need, tol)


def test_conv1d_and_unbatched_first_layers_take_kept_columns(monkeypatch):
    torch = pytest.importorskip("torch")
    _route_only_through_kept_columns(monkeypatch)
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 3, 13)), rng.standard_normal((5, 3, 3)), \
        rng.standard_normal(5)
    _compare(torch, x, w, b, (2, 1, 1, 1), "wb", 1e-10, spatial=1)
    _compare(torch, x[0], w, b, (1, "same", 2, 1), "wb", 1e-10, spatial=1)
    _compare(torch, rng.standard_normal((3, 6, 5)), rng.standard_normal((4, 3, 2, 2)), None,
             (1, 0, 1, 1), "w", 1e-10)


def test_grouped_first_layer_keeps_the_general_columns():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x, w, b = rng.standard_normal((2, 4, 6, 5)), rng.standard_normal((6, 2, 3, 3)), \
        rng.standard_normal(6)
    _compare(torch, x, w, b, (1, 1, 1, 2), "wb", 1e-10)


@pytest.mark.parametrize("case", CASES)
def test_numba_and_numpy_columns_are_the_same(monkeypatch, case):
    """The columns (a copy) are equal bit for bit whether Numba's loop or NumPy fills them."""
    from neural_arch.backends import numba_backend
    if not numba_backend.is_available():
        pytest.skip("needs Numba")
    cin, cout, kernel, stride, padding, dilation, image = case
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, cin) + image).astype(np.float32)
    w, b = rng.standard_normal((cout, cin) + kernel), rng.standard_normal(cout)
    stride, padding, dilation = (ops_conv.expand_param(v, 2, "", "", 0)
                                 for v in (stride, padding, dilation))
    out_hw = tuple((size + 2 * p - d * (k - 1) - 1) // s + 1
                   for size, k, s, p, d in zip(image, kernel, stride, padding, dilation))
    geom = conv_cpu.Geometry(2, cin, image[0], image[1], cout, 1, kernel, stride, dilation,
                             tuple((p, p) for p in padding), out_hw)
    assert conv_cpu.numba_kernels(np.dtype(np.float32)) is not None
    out, columns = conv_kept_columns.forward(x, w.astype(np.float32), b.astype(np.float32),
                                             geom)
    monkeypatch.setattr(conv_cpu, "_kernels", False)
    numpy_out, numpy_columns = conv_kept_columns.forward(
        x, w.astype(np.float32), b.astype(np.float32), geom)
    np.testing.assert_array_equal(columns, numpy_columns)
    np.testing.assert_array_equal(out, numpy_out)
    assert columns.shape == (2, cin * kernel[0] * kernel[1] + 1, out_hw[0] * out_hw[1])


def test_weight_and_bias_gradients_against_finite_differences():
    """Without torch too: an input that needs no gradient, a strided dilated padded case."""
    from neural_arch.core import gradcheck
    rng = np.random.default_rng(5)
    x = Tensor(rng.standard_normal((2, 3, 6, 7)))
    w, b = Tensor(rng.standard_normal((4, 3, 3, 2)), requires_grad=True), \
        Tensor(rng.standard_normal(4), requires_grad=True)
    assert gradcheck(lambda c, d: F.conv2d(x, c, d, stride=(2, 1), padding=(1, 2),
                                           dilation=(1, 2)), [w, b])
