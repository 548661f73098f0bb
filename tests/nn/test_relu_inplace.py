"""``nn.ReLU(inplace=True)``, ``F.relu(x, inplace=True)`` and ``relu_`` against torch: the
input is written, gradients equal torch's, and torch's in-place errors are raised."""
import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import Tensor
import neural_arch.nn.functional as F

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)

VALUES = np.array([[-1.5, 0.0, 2.0], [3.0, -0.25, 0.5]])


def test_relu_module_inplace_writes_its_input_and_matches_torch_gradients():
    x, tx = Tensor(VALUES.copy(), requires_grad=True), torch.tensor(VALUES, requires_grad=True)
    h, th = x * 2.0, tx * 2.0
    out = nn.ReLU(inplace=True)(h)
    tout = torch.nn.ReLU(inplace=True)(th)
    assert out is h
    np.testing.assert_array_equal(h.array, th.detach().numpy())
    (out * out).sum().backward()
    (tout * tout).sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-12)
    assert repr(nn.ReLU(inplace=True)) == repr(torch.nn.ReLU(inplace=True))


def test_functional_relu_inplace_without_grad_writes_and_counts_a_version():
    x = Tensor(VALUES.copy())
    assert F.relu(x, inplace=True) is x and x._version == 1
    np.testing.assert_array_equal(x.array, np.maximum(VALUES, 0))
    y = Tensor(VALUES.copy())
    assert F.relu_(y) is y and y.relu_() is y


def test_inplace_relu_on_a_leaf_that_requires_grad_raises_as_torch():
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        F.relu(Tensor(VALUES.copy(), requires_grad=True), inplace=True)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        torch.nn.functional.relu(torch.tensor(VALUES, requires_grad=True), inplace=True)


def test_inplace_relu_of_a_saved_input_raises_at_backward_as_torch():
    x, tx = Tensor(VALUES.copy(), requires_grad=True), torch.tensor(VALUES, requires_grad=True)
    h, th = x * 1.0, tx * 1.0
    y, ty = h.exp(), th.exp()  # exp saves its output; sigmoid-like ops save what they read
    z, tz = h * h, th * th  # saves h
    F.relu(h, inplace=True)
    torch.nn.functional.relu(th, inplace=True)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        tz.sum().backward()
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        z.sum().backward()
