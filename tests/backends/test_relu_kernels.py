"""``relu`` on NumPy arrays runs compiled kernels (one pass each way): same values and
gradients as torch, with torch's rules where NumPy's product differs (a NaN or infinite
gradient where the input was negative gives 0, not NaN), on contiguous and strided inputs,
float32 and float64, with and without Numba."""
from __future__ import annotations

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.core import Tensor, fused_activations

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(60)


def _both(x, g):
    ours = Tensor(x.copy(), requires_grad=True)
    out = F.relu(ours)
    out.backward(g)
    theirs = torch.tensor(x.copy(), requires_grad=True)
    t_out = torch.relu(theirs)
    t_out.backward(torch.tensor(g))
    return (out.array, ours.grad), (t_out.detach().numpy(), theirs.grad.numpy())


@pytest.mark.parametrize("form", ["kernels", "numpy"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_values_and_gradients_match_torch(form, dtype, monkeypatch):
    if form == "numpy":
        monkeypatch.setattr(fused_activations, "_relu_kernels", False)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((4, 3, 5, 6)).astype(dtype)
    x[0, 0, 0, :2] = [0.0, -0.0]
    if form == "kernels":
        x[0, 0, 0, 2] = np.nan  # torch passes its gradient (NumPy's form gives 0)
    g = rng.standard_normal(x.shape).astype(dtype)
    (out, grad), (t_out, t_grad) = _both(x, g)
    assert out.dtype == dtype and grad.dtype == dtype
    np.testing.assert_array_equal(out, t_out)
    np.testing.assert_array_equal(grad, t_grad)


def test_the_kernels_run_where_numba_does():
    from neural_arch.backends import numba_backend
    F.relu(Tensor(np.ones(3)))
    expected = numba_backend.is_available()
    assert bool(fused_activations._relu_kernels) == expected


def test_a_nan_or_infinite_gradient_where_the_input_was_negative_gives_zero_as_torch():
    x = np.array([[-1.0, 2.0, -3.0, 0.0]], np.float32)
    g = np.array([[np.nan, np.inf, np.inf, np.nan]], np.float32)
    (out, grad), (t_out, t_grad) = _both(x, g)
    np.testing.assert_array_equal(t_grad, [[0.0, np.inf, 0.0, 0.0]])
    np.testing.assert_array_equal(grad, t_grad)


def test_strided_inputs_and_gradients():
    rng = np.random.default_rng(1)
    base = rng.standard_normal((6, 8))
    x = base[:, ::2]  # not contiguous
    ours = Tensor(x, requires_grad=True)
    out = F.relu(ours.t())  # a view's relu: the gradient comes back through the transpose
    g = rng.standard_normal((8, 6))[::2]
    out.backward(g)
    np.testing.assert_array_equal(out.array, np.maximum(x.T, 0))
    np.testing.assert_array_equal(ours.grad, (g * (x.T > 0)).T)


def test_the_saved_output_is_still_checked_against_inplace_writes():
    from neural_arch.core import no_grad
    y = F.relu(Tensor(np.ones((2, 3), np.float32), requires_grad=True) * 1.0)
    with no_grad():
        y.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.sum().backward()
