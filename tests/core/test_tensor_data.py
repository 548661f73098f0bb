"""``.data`` as torch has it: a tensor sharing the storage, cut from the graph, with a version
counter of its own; ``.array`` is the raw array. Checked against torch where torch is installed."""
import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn
from neural_arch.core.tensor import Tensor

torch = pytest.importorskip("torch")


def _pair(values, requires_grad=True):
    ours = Tensor(np.array(values, dtype=np.float64), requires_grad=requires_grad)
    theirs = torch.tensor(np.array(values, dtype=np.float64), requires_grad=requires_grad)
    return ours, theirs


def test_data_is_a_tensor_sharing_storage_and_cut_from_the_graph():
    ours, theirs = _pair([1.0, 2.0, 3.0])
    d, td = ours.data, theirs.data
    assert isinstance(d, Tensor) and not d.requires_grad and d.is_leaf
    assert (d.requires_grad, d.grad_fn) == (td.requires_grad, td.grad_fn)
    assert np.shares_memory(d.array, ours.array)
    d.add_(10.0)
    td.add_(10.0)
    np.testing.assert_array_equal(ours.array, theirs.detach().numpy())
    # the write through .data is not counted on the tensor itself, in either framework
    assert ours._version == theirs._version == 0


def test_array_is_the_raw_ndarray():
    x = Tensor(np.arange(4.0))
    assert type(x.array) is np.ndarray
    x.array[0] = 7.0
    assert x.data.tolist() == [7.0, 1.0, 2.0, 3.0]


def test_write_through_data_after_saving_for_backward_does_not_raise_as_in_torch():
    ours, theirs = _pair([1.0, -2.0, 3.0])
    y, ty = ours * ours, theirs * theirs
    ours.data.mul_(2.0)
    theirs.data.mul_(2.0)
    y.sum().backward()
    ty.sum().backward()
    np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=1e-12)


def test_assigning_data_rebinds_the_storage():
    ours, theirs = _pair([1.0, 2.0])
    ours.data = Tensor(np.zeros((2, 3)))
    theirs.data = torch.zeros((2, 3), dtype=torch.float64)
    assert tuple(ours.shape) == tuple(theirs.shape) == (2, 3)
    assert ours.requires_grad and theirs.requires_grad
    ours.data = np.ones(4)
    assert ours.tolist() == [1.0] * 4
    with pytest.raises(TypeError, match="data must be a Tensor or an array, got list"):
        ours.data = [1.0, 2.0]


def test_manual_sgd_through_data_matches_torch():
    rng = np.random.default_rng(0)
    w0, x0 = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    ours = nn.Linear(4, 3, bias=False, dtype=na.float64)
    theirs = torch.nn.Linear(4, 3, bias=False, dtype=torch.float64)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(w0))
    ours.weight.data = Tensor(w0.copy())
    for _ in range(3):
        ours.zero_grad()
        theirs.zero_grad()
        (ours(Tensor(x0)) ** 2).sum().backward()
        (theirs(torch.from_numpy(x0)) ** 2).sum().backward()
        for p, tp in zip(ours.parameters(), theirs.parameters()):
            p.data.add_(p.grad, alpha=-0.01)
            tp.data.add_(tp.grad, alpha=-0.01)
    np.testing.assert_allclose(ours.weight.array, theirs.weight.detach().numpy(), rtol=1e-12)


def test_initialising_through_data_with_a_generator_matches_itself_and_stays_a_leaf():
    layer = nn.Linear(3, 2)
    layer.weight.data.uniform_(-0.1, 0.1)
    layer.bias.data.zero_()
    assert np.all(np.abs(layer.weight.array) <= 0.1) and not np.any(layer.bias.array)
    assert layer.weight.is_leaf and layer.weight.requires_grad and layer.weight._version == 0
