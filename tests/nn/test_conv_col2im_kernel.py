"""The strided CPU convolution's input gradient through the Numba col2im kernel
(``backends.conv_kernels``) against torch and against the NumPy form (a zero-bordered buffer,
one strided addition per tap): strides 2-4, padding wider and narrower than the stride,
dilation, groups, non-square images and kernels, float32 and float64."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch.backends import numba_backend
from neural_arch.core import Tensor, conv_cpu

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.timeout(60),
              pytest.mark.skipif(not numba_backend.is_available(), reason="needs Numba")]

# (channels in, out, kernel, stride, padding, dilation, groups, image (h, w))
CASES = [
    (4, 8, (3, 3), 2, 1, 1, 1, (9, 8)),      # the stride-2 block entry
    (4, 8, (1, 1), 2, 0, 1, 1, (7, 9)),      # its 1x1 shortcut
    (6, 6, (3, 3), 3, 2, 2, 6, (10, 11)),    # depthwise, dilated, stride 3
    (3, 5, (2, 4), (2, 3), (1, 2), 1, 1, (7, 10)),
    (2, 4, (5, 5), 4, 3, 1, 2, (6, 5)),      # padding wider than the stride, kernel > image
    (2, 2, (1, 3), (3, 1), 0, (1, 2), 1, (8, 9)),
]


def _run(case, dtype, seed=0):
    cin, cout, kernel, stride, padding, dilation, groups, image = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((3, cin) + image).astype(dtype)
    w = rng.standard_normal((cout, cin // groups) + kernel).astype(dtype)
    X, W = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = F.conv2d(X, W, None, stride, padding, dilation, groups)
    g = rng.standard_normal(out.shape).astype(dtype)
    out.backward(g)
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    torch.nn.functional.conv2d(tx, tw, None, stride, padding, dilation, groups).backward(
        torch.tensor(g))
    return (X.grad, W.grad), (tx.grad.numpy(), tw.grad.numpy())


def test_the_kernel_is_taken_where_numba_runs():
    from neural_arch.backends import conv_kernels
    assert conv_cpu.numba_kernels(np.dtype(np.float32)) is conv_kernels
    assert conv_cpu.numba_kernels(np.dtype(np.float16)) is None


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 3e-4)])
def test_input_gradient_matches_torch_and_the_numpy_form(monkeypatch, case, dtype, tol):
    monkeypatch.setattr(conv_cpu, "SPAN_BYTES", 1)  # a span per sample: the kernel's offsets
    (gx, gw), (tgx, tgw) = _run(case, dtype)
    np.testing.assert_allclose(gx, tgx, rtol=tol, atol=tol)
    np.testing.assert_allclose(gw, tgw, rtol=tol, atol=tol)
    monkeypatch.setattr(conv_cpu, "_kernels", False)
    (numpy_gx, _), _ = _run(case, dtype)
    np.testing.assert_allclose(gx, numpy_gx, rtol=tol, atol=tol)
