"""``.grad`` as torch has it: a tensor (or None) with torch's methods, its raw array at
``.grad.array``; assignment checks the shape; hooks receive tensors. Against torch."""
import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core.tensor import Tensor
from neural_arch.optim import SGD

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)


def _pair(values):
    return (Tensor(np.array(values, dtype=np.float64), requires_grad=True),
            torch.tensor(np.array(values, dtype=np.float64), requires_grad=True))


def test_grad_is_a_tensor_with_torchs_methods():
    x, tx = _pair([1.0, -2.0, 3.0])
    (x * x).sum().backward()
    (tx * tx).sum().backward()
    assert isinstance(x.grad, Tensor) and not x.grad.requires_grad
    assert x.grad.norm().item() == pytest.approx(tx.grad.norm().item(), rel=1e-12)
    np.testing.assert_array_equal(x.grad.data.array, tx.grad.data.numpy())
    assert type(x.grad.array) is np.ndarray
    x.grad.zero_()
    tx.grad.zero_()
    np.testing.assert_array_equal(x.grad.array, tx.grad.numpy())


def test_backward_accumulates_into_the_same_gradient_tensor_as_torch():
    x, tx = _pair([1.0, 2.0])
    x.sum().backward()
    tx.sum().backward()
    g, tg = x.grad, tx.grad
    (x * 3.0).sum().backward()
    (tx * 3.0).sum().backward()
    assert (x.grad is g) == (tx.grad is tg)
    np.testing.assert_array_equal(g.array, tg.numpy())


def test_assigning_grad_checks_the_shape_as_torch():
    x, tx = _pair([1.0, 2.0])
    x.grad = Tensor(np.ones(2))
    tx.grad = torch.ones(2, dtype=torch.float64)
    x.grad = np.full(2, 5.0)  # a raw array is wrapped
    assert isinstance(x.grad, Tensor) and x.grad.tolist() == [5.0, 5.0]
    with pytest.raises(RuntimeError, match="attempting to assign a gradient of size"):
        tx.grad = torch.ones(3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="attempting to assign a gradient of size"):
        x.grad = Tensor(np.ones(3))
    with pytest.raises(TypeError, match="assigned grad must be a Tensor, an array or None"):
        x.grad = [1.0, 2.0]
    x.grad = None
    assert x.grad is None


def test_hooks_receive_tensors_and_may_return_them():
    x, tx = _pair([1.0, -2.0, 3.0])
    seen = []
    x.register_hook(lambda g: seen.append(g.clone()) or g.clamp(-1.0, 1.0) * 2)
    tx.register_hook(lambda g: g.clamp(-1.0, 1.0) * 2)
    (x * x).sum().backward()
    (tx * tx).sum().backward()
    assert isinstance(seen[0], Tensor)
    np.testing.assert_array_equal(seen[0].array, 2 * np.array([1.0, -2.0, 3.0]))
    np.testing.assert_array_equal(x.grad.array, tx.grad.numpy())


def test_a_hand_written_training_loop_on_grad_tensors_matches_torch():
    rng = np.random.default_rng(0)
    w0, x0 = rng.standard_normal((2, 3)), rng.standard_normal((4, 3))
    ours = nn.Linear(3, 2, bias=False).double()
    theirs = torch.nn.Linear(3, 2, bias=False).double()
    ours.weight.data = Tensor(w0.copy())
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(w0))
    opt, topt = SGD(ours.parameters(), lr=0.1), torch.optim.SGD(theirs.parameters(), lr=0.1)
    for _ in range(3):
        opt.zero_grad()
        topt.zero_grad()
        (ours(Tensor(x0)) ** 2).mean().backward()
        (theirs(torch.from_numpy(x0)) ** 2).mean().backward()
        for p, tp in zip(ours.parameters(), theirs.parameters()):
            p.grad.mul_(0.5).clamp_(-0.2, 0.2)  # in place on the gradient tensors
            tp.grad.mul_(0.5).clamp_(-0.2, 0.2)
        opt.step()
        topt.step()
    np.testing.assert_allclose(ours.weight.array, theirs.weight.detach().numpy(), rtol=1e-12)
