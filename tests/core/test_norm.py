"""``Tensor.norm`` / ``torch.norm``: values and gradients against torch, including the zero
vector (gradient 0, not NaN) and ties of the inf-norm."""
import numpy as np
import pytest

import neural_arch as na
from neural_arch.core.tensor import Tensor

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)

VALUES = np.array([[3.0, -4.0, 0.5], [0.0, 2.0, -2.0]])


ORDERS = ["fro", 2, 1, 3, 0.5, float("inf"), float("-inf"), 0]
DIMS = [(None, False), (1, False), (0, True), ((0, 1), False)]
# torch's 'fro' takes two dims or none
CASES = [(p, dim, keep) for p in ORDERS for dim, keep in DIMS
         if not (p == "fro" and isinstance(dim, int))]


@pytest.mark.parametrize("p,dim,keepdim", CASES)
def test_norm_matches_torch(p, dim, keepdim):
    x = Tensor(VALUES.copy(), requires_grad=True)
    tx = torch.tensor(VALUES, requires_grad=True)
    out = x.norm(p, dim=dim, keepdim=keepdim)
    tout = tx.norm(p, dim=dim, keepdim=keepdim)
    np.testing.assert_allclose(out.array, tout.detach().numpy(), rtol=1e-12, atol=1e-12)
    seed = np.arange(1.0, 1.0 + tout.numel()).reshape(tuple(tout.shape))
    out.backward(seed)
    tout.backward(torch.from_numpy(seed))
    if tx.grad is None:  # the 0-"norm" counts: torch leaves the gradient undefined
        assert x.grad is None
    else:
        np.testing.assert_allclose(x.grad.array, tx.grad.numpy(), rtol=1e-12, atol=1e-12)


def test_zero_norm_has_a_zero_gradient_and_the_function_form():
    x, tx = Tensor(np.zeros(3), requires_grad=True), torch.zeros(3, dtype=torch.float64,
                                                                 requires_grad=True)
    na.norm(x).backward()
    torch.norm(tx).backward()
    np.testing.assert_array_equal(x.grad.array, tx.grad.numpy())
    with pytest.raises(RuntimeError, match="floating point"):
        Tensor(np.arange(3)).norm()
