"""The CPU convolution of ``conv_cpu`` (wide columns at stride 1, span columns when strided)
against torch and against the whole-batch columns form: values and input / weight / bias
gradients, odd shapes, strides 1-3, padding 0 / 1 / 'same', dilation, groups, spans cut
short, only one of the two gradients wanted."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch.core import Tensor, conv_cpu

pytestmark = pytest.mark.timeout(60)

# (channels in, out, kernel, stride, padding, dilation, groups, image (h, w))
CASES = [
    (3, 16, (3, 3), 1, 1, 1, 1, (9, 7)),       # a stem
    (4, 4, (3, 3), 1, 1, 1, 1, (5, 6)),
    (4, 8, (3, 3), 2, 1, 1, 1, (9, 8)),        # the stride-2 block entry
    (4, 8, (1, 1), 2, 0, 1, 1, (7, 9)),        # its 1x1 shortcut
    (6, 6, (3, 2), 1, 0, 1, 3, (8, 7)),        # valid, grouped, non-square kernel
    (6, 4, (3, 3), 1, 2, 2, 2, (7, 7)),        # dilated "same"
    (4, 6, (2, 4), 1, "same", 1, 1, (6, 9)),   # even kernel: the odd pad goes after
    (6, 6, (3, 3), 3, 2, 2, 6, (10, 11)),      # depthwise, stride 3
    (2, 3, (1, 1), 1, 0, 1, 1, (4, 5)),        # 1x1
    (2, 3, (3, 3), 1, 3, 1, 1, (4, 4)),        # padding wider than the kernel: the fallback
]


def _torch(torch, x, w, b, case, gout, need_x):
    _, _, _, stride, padding, dilation, groups, _ = case
    tx = torch.tensor(x, requires_grad=need_x)
    tw = torch.tensor(w, requires_grad=True)
    tb = torch.tensor(b, requires_grad=True)
    out = torch.nn.functional.conv2d(tx, tw, tb, stride, padding, dilation, groups)
    out.backward(torch.tensor(gout))
    return [out.detach().numpy(), tx.grad.numpy() if need_x else None, tw.grad.numpy(),
            tb.grad.numpy()]


def _ours(x, w, b, case, gout, need_x):
    _, _, _, stride, padding, dilation, groups, _ = case
    X, W, B = Tensor(x, requires_grad=need_x), Tensor(w, requires_grad=True), \
        Tensor(b, requires_grad=True)
    out = F.conv2d(X, W, B, stride, padding, dilation, groups)
    out.backward(gout)
    return [out.array, X.grad if need_x else None, W.grad, B.grad]


def _output_shape(x, w, case):
    _, _, _, stride, padding, dilation, groups, _ = case
    return F.conv2d(Tensor(x), Tensor(w), None, stride, padding, dilation, groups).shape


def _data(case, batch, dtype, seed=0):
    cin, cout, kernel, *_, groups, image = case
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, cin) + image).astype(dtype)
    w = rng.standard_normal((cout, cin // groups) + kernel).astype(dtype)
    return x, w, rng.standard_normal(cout).astype(dtype), rng


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: even-kernel "same" makes a copy
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 3e-4)])
@pytest.mark.parametrize("need_x", [True, False])
def test_matches_torch_across_short_spans(monkeypatch, case, dtype, tol, need_x):
    torch = pytest.importorskip("torch")
    # spans of two samples: a batch of 5 ends on a short span
    x, w, b, rng = _data(case, 5, dtype)
    per_sample = x.shape[1] * w.shape[2] * w.shape[3] * x.shape[2] * x.shape[3] * x.itemsize
    monkeypatch.setattr(conv_cpu, "SPAN_BYTES", 2 * per_sample + 8)
    gout = rng.standard_normal(_output_shape(x, w, case)).astype(dtype)
    got, want = _ours(x, w, b, case, gout, need_x), _torch(torch, x, w, b, case, gout, need_x)
    for name, g, ref in zip(("out", "grad x", "grad w", "grad b"), got, want):
        if ref is None:
            assert g is None, name
            continue
        assert g.dtype == dtype and g.shape == ref.shape, name
        np.testing.assert_allclose(g, ref, rtol=tol, atol=tol, err_msg=name)


@pytest.mark.parametrize("case", CASES[:4])
def test_equals_the_whole_batch_columns_form(monkeypatch, case):
    """The form every other array module takes (``conv_cpu.supports`` says no) agrees."""
    x, w, b, rng = _data(case, 3, np.float64, seed=1)
    gout = rng.standard_normal(_output_shape(x, w, case))
    new = _ours(x, w, b, case, gout, True)
    monkeypatch.setattr(conv_cpu, "supports", lambda geom: False)
    old = _ours(x, w, b, case, gout, True)
    for g, ref in zip(new, old):
        np.testing.assert_allclose(g, ref, rtol=1e-12, atol=1e-12)


def test_padding_wider_than_the_kernel_is_not_taken_at_stride_1():
    geom = conv_cpu.Geometry(1, 2, 4, 4, 3, 1, (3, 3), (1, 1), (1, 1), ((3, 3), (3, 3)),
                             (8, 8))
    assert not conv_cpu.supports(geom)
    assert conv_cpu.supports(geom.__class__(**{**geom.__dict__, "pads": ((2, 2), (1, 1)),
                                               "out_hw": (6, 4)}))


def test_conv1d_and_unbatched_input_take_the_cpu_form():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x, w = rng.standard_normal((4, 13)), rng.standard_normal((6, 2, 3))
    X, W = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
    out = F.conv1d(X, W, None, 1, 1, 1, 2)
    out.sum().backward()
    tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
    ref = torch.nn.functional.conv1d(tx, tw, None, 1, 1, 1, 2)
    ref.sum().backward()
    np.testing.assert_allclose(out.array, ref.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(X.grad, tx.grad.numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(W.grad, tw.grad.numpy(), rtol=1e-10, atol=1e-10)
