"""LayerNorm and softmax of the NumPy backend: the compiled kernels and the ``row_ops`` forms,
against float64 references, forward and backward, and the front end on either."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch.backends import norm_softmax_kernels as kernels
from neural_arch.backends import numpy_backend, row_ops
from neural_arch.core import Tensor
from neural_arch.core.fused_activations import causal_softmax

KERNELS = pytest.param("kernels", marks=pytest.mark.skipif(
    not kernels.available(), reason="Numba is not installed or is switched off"))
FORMS = [KERNELS, "numpy"]
DTYPES = [np.float32, np.float64]
TOL = {np.float32: 2e-5, np.float64: 1e-12}
SHAPES = [(1, 1), (3, 1), (5, 7), (2, 3, 129), (64,)]


def use(monkeypatch, which: str) -> None:
    """Make the backend run the kernels or the NumPy forms."""
    monkeypatch.setattr(numpy_backend, "_row_kernels", kernels if which == "kernels" else False)


def data(shape, dtype, seed=0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


def layer_norm_reference(x, w, b, eps):
    v = x.astype(np.float64)
    mean = v.mean(-1, keepdims=True)
    inv = 1.0 / np.sqrt(((v - mean) ** 2).mean(-1, keepdims=True) + eps)
    n = (v - mean) * inv
    return n * w + b, n, inv


def layer_norm_grads_reference(g, x, w, eps):
    g, w = g.astype(np.float64), w.astype(np.float64)
    _, n, inv = layer_norm_reference(x, 1.0, 0.0, eps)
    gn = g * w
    gx = (gn - gn.mean(-1, keepdims=True) - n * (gn * n).mean(-1, keepdims=True)) * inv
    cols = x.shape[-1]
    return gx, (g * n).reshape(-1, cols).sum(0), g.reshape(-1, cols).sum(0)


def close(got, want, dtype, scale=1.0):
    tol = TOL[dtype] * scale
    assert got.dtype == dtype, got.dtype
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 1e-6, 1e6])
def test_layer_norm_forward_and_backward(monkeypatch, which, dtype, shape, scale):
    use(monkeypatch, which)
    x = data(shape, dtype, 1, scale) + dtype(3 * scale)
    w, b = data(shape[-1:], dtype, 2), data(shape[-1:], dtype, 3)
    g = data(shape, dtype, 4)
    out, n, inv = numpy_backend.layer_norm(x, w, b, 1e-5, True)
    ref_out, ref_n, ref_inv = layer_norm_reference(x, w, b, 1e-5)
    close(out, ref_out, dtype)
    close(n, ref_n, dtype)
    close(inv, ref_inv, dtype, scale=max(1.0, 1.0 / scale))
    grads = numpy_backend.layer_norm_backward(g, n, inv, w, (True, True, True))
    for got, want in zip(grads, layer_norm_grads_reference(g, x, w, 1e-5)):
        close(got, want, dtype, scale=10 * max(1.0, 1.0 / scale))


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_without_affine_non_contiguous_and_partial_need(monkeypatch, which, dtype):
    use(monkeypatch, which)
    x = data((6, 10), dtype).T[::2]  # (5, 6), strided
    assert not x.flags.c_contiguous
    out, n, inv = numpy_backend.layer_norm(x, None, None, 1e-3, True)
    close(out, layer_norm_reference(x, 1.0, 0.0, 1e-3)[0], dtype)
    assert numpy_backend.layer_norm(x, None, None, 1e-3, False)[1:] == (None, None)
    g = data((6, 10), dtype, 5).T[::2]
    gx, gw, gb = numpy_backend.layer_norm_backward(g, n, inv, None, (True, False, False))
    assert gw is None and gb is None
    ones = np.ones(x.shape[-1])
    close(gx, layer_norm_grads_reference(g, x, ones, 1e-3)[0], dtype, scale=10)
    gx, gw, gb = numpy_backend.layer_norm_backward(g, n, inv, None, (False, True, True))
    assert gx is None and gw.shape == gb.shape == (6,)


def layer_norm_loss(x, w, b, probe):
    return float((layer_norm_reference(x, w, b, 1e-5)[0] * probe).sum())


@pytest.mark.parametrize("which", FORMS)
def test_layer_norm_gradients_match_finite_differences(monkeypatch, which):
    use(monkeypatch, which)
    x, w, b = data((3, 5), np.float64, 6), data((5,), np.float64, 7), data((5,), np.float64, 8)
    probe = data((3, 5), np.float64, 9)
    t, tw, tb = (Tensor(a.copy(), requires_grad=True) for a in (x, w, b))
    (F.layer_norm(t, 5, tw, tb) * Tensor(probe)).sum().backward()
    step = 1e-6
    for tensor, array in ((t, x), (tw, w), (tb, b)):
        numeric = np.zeros_like(array)
        for i in np.ndindex(array.shape):
            up, down = array.copy(), array.copy()
            up[i] += step
            down[i] -= step
            args = [up if a is array else a for a in (x, w, b)]
            low = [down if a is array else a for a in (x, w, b)]
            numeric[i] = (layer_norm_loss(*args, probe) - layer_norm_loss(*low, probe)) / (2 * step)
        np.testing.assert_allclose(tensor.grad, numeric, rtol=1e-6, atol=1e-7)


def softmax_reference(x, offset=None):
    v = x.astype(np.float64)
    if offset is not None:
        v = np.where(row_ops.causal_mask(np, v.shape[-2], v.shape[-1], offset), -np.inf, v)
    with np.errstate(invalid="ignore"):
        e = np.exp(v - v.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("scale", [1.0, 1e-6, 100.0])
def test_softmax_forward_and_backward(monkeypatch, which, dtype, shape, scale):
    use(monkeypatch, which)
    x, g = data(shape, dtype, 1, scale), data(shape, dtype, 2)
    out = numpy_backend.softmax(x, -1, None)
    close(out, softmax_reference(x), dtype)
    ref = softmax_reference(x)
    want = ref * (g - (g * ref).sum(-1, keepdims=True))
    close(numpy_backend.softmax_backward(g, out, -1), want, dtype, scale=4)


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length, cols", [(1, 1), (7, 7), (5, 9), (9, 5), (64, 64)])
def test_causal_softmax_matches_the_masked_form(monkeypatch, which, dtype, length, cols):
    use(monkeypatch, which)
    x = data((2, 3, length, cols), dtype, 3, 4.0)
    g = data(x.shape, dtype, 4)
    offset = cols - length
    with np.errstate(invalid="ignore"):
        out = numpy_backend.softmax(x, -1, offset)
        ref = softmax_reference(x, offset)  # rows with nothing visible (length > cols) are NaN
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    close(np.nan_to_num(out), np.nan_to_num(ref), dtype)
    visible = ~np.isnan(ref)
    grad = numpy_backend.softmax_backward(np.where(visible, g, 0), np.nan_to_num(out), -1)
    r = np.nan_to_num(ref)
    gv = np.where(visible, g, 0).astype(np.float64)
    close(grad, r * (gv - (gv * r).sum(-1, keepdims=True)), dtype, scale=4)


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_rows_with_infinities_and_nan_match_the_numpy_form(monkeypatch, which, dtype):
    inf, nan = np.inf, np.nan
    x = np.array([[0.0, -inf, 1.0, -inf],    # masked entries: weight 0
                  [-inf, -inf, -inf, -inf],  # fully masked: NaN
                  [1.0, inf, 0.0, 2.0],      # +inf: NaN, as exp(inf - inf)
                  [1.0, nan, 0.0, 2.0],      # NaN: NaN
                  [3e4, -3e4, 1e4, 3e4]], dtype=dtype)
    with np.errstate(invalid="ignore"):
        want = row_ops.softmax(x, -1, None, np)
        use(monkeypatch, which)
        got = numpy_backend.softmax(x, -1, None)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert np.isnan(got[1:4]).all() and got[0, 1] == got[0, 3] == 0.0
    np.testing.assert_allclose(got[[0, 4]], want[[0, 4]], rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_softmax_of_non_contiguous_input(monkeypatch, which, dtype):
    use(monkeypatch, which)
    x = data((3, 9, 8), dtype, 7).transpose(0, 2, 1)[:, ::2]  # (3, 4, 9), strided
    g = data((3, 9, 8), dtype, 8).transpose(0, 2, 1)[:, ::2]
    assert not x.flags.c_contiguous
    for offset in (None, 5):
        out = numpy_backend.softmax(x, -1, offset)
        ref = softmax_reference(x, offset)
        close(out, ref, dtype)
        want = ref * (g - (g * ref).sum(-1, keepdims=True))
        close(numpy_backend.softmax_backward(g, out, -1), want, dtype, scale=4)


@pytest.mark.parametrize("which", FORMS)
def test_other_axes_dtypes_and_mixed_dtypes_take_the_numpy_form(monkeypatch, which):
    use(monkeypatch, which)
    x = data((3, 4, 5), np.float32)
    close(numpy_backend.softmax(x, 1, None), np.moveaxis(
        softmax_reference(np.moveaxis(x, 1, -1)), -1, 1), np.float32)
    half = numpy_backend.softmax(x.astype(np.float16), -1, None)
    assert half.dtype == np.float16
    out = numpy_backend.layer_norm(x, np.ones(5), None, 1e-5, False)[0]
    assert out.dtype == np.float64  # as NumPy promotes float32 x float64
    empty = numpy_backend.layer_norm(np.zeros((0, 5), np.float32), None, None, 1e-5, True)
    assert empty[0].shape == (0, 5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_front_end_gives_the_same_graph_on_either_form(monkeypatch, dtype):
    """F.layer_norm (also over two trailing dims), F.softmax and causal attention: outputs and
    gradients of the kernels equal those of the NumPy forms, and causal attention equals the
    explicitly masked form."""
    if not kernels.available():
        pytest.skip("Numba is not installed or is switched off")

    def run(which):
        use(monkeypatch, which)
        x = Tensor(data((2, 3, 4, 6), dtype, 1), requires_grad=True)
        w = Tensor(data((4, 6), dtype, 2), requires_grad=True)
        q, k, v = (Tensor(data((2, 3, 5, 4), dtype, s), requires_grad=True) for s in (3, 4, 5))
        y = F.layer_norm(x, (4, 6), w, None).sum() + (F.softmax(x, -1) * x).sum()
        y = y + (F.scaled_dot_product_attention(q, k, v, causal=True) * v).sum()
        y.backward()
        return [a.astype(np.float64) for a in (y.array, x.grad, w.grad, q.grad, k.grad, v.grad)]

    for got, want in zip(run("kernels"), run("numpy")):
        np.testing.assert_allclose(got, want, rtol=10 * TOL[dtype], atol=10 * TOL[dtype])
    q, k, v = (Tensor(data((2, 5, 4), dtype, s)) for s in (3, 4, 5))
    allowed = np.tril(np.ones((5, 5), dtype=bool))
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, causal=True).array,
                               F.scaled_dot_product_attention(q, k, v, mask=allowed).array,
                               rtol=TOL[dtype], atol=TOL[dtype])


def test_causal_softmax_checks_dimensions_and_records_no_graph_without_grad():
    with pytest.raises(ValueError, match=r"shape \(4,\)"):
        causal_softmax(Tensor(np.zeros(4)))
    assert not causal_softmax(Tensor(np.zeros((2, 2)))).requires_grad


def test_numpy_forms_are_selected_when_numba_is_switched_off():
    import os
    import subprocess
    import sys
    code = ("import numpy as np\n"
            "from neural_arch.backends import norm_softmax_kernels, numpy_backend\n"
            "assert not norm_softmax_kernels.available()\n"
            "x = np.ones((2, 3), dtype=np.float32)\n"
            "assert numpy_backend.softmax(x, -1, 0).dtype == np.float32\n"
            "assert numpy_backend.layer_norm(x, None, None, 1e-5, False)[0].dtype == np.float32\n"
            "assert numpy_backend._row_kernels is False\n")
    env = dict(os.environ, NEURAL_ARCH_NUMBA="0")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
