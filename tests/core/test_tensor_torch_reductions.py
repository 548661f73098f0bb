"""torch's ``max`` / ``min`` (whole tensor, along a dim as ``(values, indices)``, elementwise
against another tensor) and ``argmax`` / ``argmin``, as Tensor methods and as functions of the
package (``import neural_arch as torch``): values, indices, gradients, types and errors against
torch."""
from __future__ import annotations

import numpy as np
import pytest

import neural_arch as na

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(11)
# ties in every row and column, so index choice and the ties' gradients are tested
TIED = np.array([[1.0, 5.0, 5.0, -2.0], [7.0, 2.0, 7.0, 0.0], [3.0, 3.0, 3.0, 3.0]])


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _pair(torch, array, dtype=np.float64):
    array = np.asarray(array, dtype=dtype)
    grad = np.dtype(dtype).kind == "f"
    return (na.tensor(array, requires_grad=grad), torch.tensor(array, requires_grad=grad))


def _same(ours, theirs):
    theirs = theirs.detach().numpy()
    assert tuple(ours.shape) == theirs.shape
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    np.testing.assert_array_equal(ours.numpy(), theirs)


def _backward_both(torch, ours, theirs):
    weights = RNG.standard_normal(tuple(ours.shape))
    (ours * weights).sum().backward()
    (theirs * torch.tensor(weights)).sum().backward()


@pytest.mark.parametrize("name", ["max", "min"])
@pytest.mark.parametrize("dim, keepdim", [(0, False), (1, False), (-1, True), (1, True)])
@pytest.mark.parametrize("spelling", ["method", "function"])
def test_max_min_along_a_dim_give_values_and_indices_with_gradients(torch, name, dim, keepdim,
                                                                     spelling):
    ours_in, theirs_in = _pair(torch, TIED)
    if spelling == "method":
        ours = getattr(ours_in, name)(dim, keepdim=keepdim)
        theirs = getattr(theirs_in, name)(dim, keepdim=keepdim)
    else:
        ours = getattr(na, name)(ours_in, dim=dim, keepdim=keepdim)
        theirs = getattr(torch, name)(theirs_in, dim=dim, keepdim=keepdim)
    assert type(ours).__name__ == name and isinstance(ours, tuple) and len(ours) == 2
    values, indices = ours
    assert values is ours.values and indices is ours.indices
    _same(ours.values, theirs.values)
    _same(ours.indices, theirs.indices)
    assert not ours.indices.requires_grad
    _backward_both(torch, ours.values, theirs.values)
    np.testing.assert_array_equal(ours_in.grad, theirs_in.grad.numpy())


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_of_the_whole_tensor_share_the_gradient_between_ties(torch, name):
    ours_in, theirs_in = _pair(torch, TIED)
    ours, theirs = getattr(ours_in, name)(), getattr(theirs_in, name)()
    _same(ours, theirs)
    ours.backward()
    theirs.backward()
    np.testing.assert_allclose(ours_in.grad, theirs_in.grad.numpy(), rtol=0, atol=1e-15)
    _same(getattr(na, name)(na.tensor(TIED)), getattr(torch, name)(torch.tensor(TIED)))


@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_against_another_tensor_are_elementwise_with_torch_gradients(torch, name):
    other = np.array([[5.0, 5.0, 0.0, -2.0], [7.0, 1.0, 9.0, 0.5], [3.0, 4.0, 2.0, 3.0]])
    a_ours, a_theirs = _pair(torch, TIED)
    b_ours, b_theirs = _pair(torch, other)
    ours, theirs = getattr(a_ours, name)(b_ours), getattr(a_theirs, name)(b_theirs)
    _same(ours, theirs)
    _backward_both(torch, ours, theirs)
    np.testing.assert_allclose(a_ours.grad, a_theirs.grad.numpy(), rtol=0, atol=1e-15)
    np.testing.assert_allclose(b_ours.grad, b_theirs.grad.numpy(), rtol=0, atol=1e-15)
    # broadcasting: the gradient of the smaller operand is summed over the broadcast axes
    c_ours, c_theirs = _pair(torch, [3.0, 5.0, 0.0, 3.0])
    ours = getattr(na, name)(na.tensor(TIED, requires_grad=True), c_ours)
    theirs = getattr(torch, name)(torch.tensor(TIED, requires_grad=True), c_theirs)
    _same(ours, theirs)
    _backward_both(torch, ours, theirs)
    np.testing.assert_allclose(c_ours.grad, c_theirs.grad.numpy(), rtol=0, atol=1e-15)
    # keyword spelling and type promotion (int against float gives float)
    _same(na.tensor([1, 2]).max(other=na.tensor([1.5, 1.0])),
          torch.tensor([1, 2]).max(other=torch.tensor([1.5, 1.0])))


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dim, keepdim", [(None, False), (None, True), (0, False), (1, True),
                                          (-1, False)])
def test_argmax_argmin_match_torch_including_keepdim(torch, name, dim, keepdim):
    ours = getattr(na.tensor(TIED), name)(dim, keepdim=keepdim)
    theirs = getattr(torch.tensor(TIED), name)(dim, keepdim=keepdim)
    _same(ours, theirs)
    _same(getattr(na, name)(na.tensor(TIED), dim=dim, keepdim=keepdim),
          getattr(torch, name)(torch.tensor(TIED), dim=dim, keepdim=keepdim))


def test_nan_integers_bools_and_zero_dim_tensors_as_torch(torch):
    nan = [[1.0, float("nan")], [3.0, 4.0]]
    for dim in (0, 1):
        ours, theirs = na.tensor(nan).max(dim), torch.tensor(nan).max(dim)
        np.testing.assert_array_equal(ours.values.numpy(), theirs.values.numpy())
        _same(ours.indices, theirs.indices)
        _same(na.tensor(nan).argmax(dim), torch.tensor(nan).argmax(dim))
    ints = [[3, 9, 9], [4, -1, 0]]
    for name in ("max", "min"):
        ours, theirs = getattr(na.tensor(ints), name)(1), getattr(torch.tensor(ints), name)(1)
        _same(ours.values, theirs.values)
        _same(ours.indices, theirs.indices)
        _same(getattr(na.tensor(ints), name)(), getattr(torch.tensor(ints), name)())
    ours, theirs = na.tensor([True, False]).max(0), torch.tensor([True, False]).max(0)
    _same(ours.values, theirs.values)
    _same(ours.indices, theirs.indices)
    for dim in (0, -1):
        ours, theirs = na.tensor(3.0).max(dim), torch.tensor(3.0).max(dim)
        _same(ours.values, theirs.values.float())
        _same(ours.indices, theirs.indices)
        _same(na.tensor(3.0).argmax(dim), torch.tensor(3.0).argmax(dim))


def test_axis_and_keepdims_keep_returning_the_values_only():
    # the NumPy spelling, which the framework's own code uses, is unchanged
    x = na.tensor(TIED, requires_grad=True)
    out = x.max(axis=1, keepdims=True)
    assert isinstance(out, na.Tensor) and out.shape == (3, 1)
    np.testing.assert_array_equal(out.numpy(), TIED.max(axis=1, keepdims=True))
    np.testing.assert_array_equal(x.min(axis=0).numpy(), TIED.min(axis=0))
    assert x.argmax(axis=1).tolist() == [1, 0, 0]


def test_errors_as_torch(torch):
    x, t = na.tensor(TIED), torch.tensor(TIED)
    for call in (lambda m: m.max(2), lambda m: m.argmax(-3), lambda m: m.min(5)):
        with pytest.raises(IndexError) as theirs:
            call(t)
        with pytest.raises(IndexError, match=r"range of \[-2, 1\], but got -?\d"):
            call(x)
        assert "Dimension out of range" in str(theirs.value)
    with pytest.raises(IndexError, match="Expected reduction dim 0 to have non-zero size"):
        na.zeros(0, 3).max(0)
    with pytest.raises(IndexError, match="Expected reduction dim 0 to have non-zero size"):
        torch.zeros(0, 3).max(0)
    _same(na.zeros(0, 3).max(1).indices, torch.zeros(0, 3).max(1).indices)
    with pytest.raises(RuntimeError, match="Expected reduction dim to be specified"):
        na.zeros(0).max()
    with pytest.raises(RuntimeError, match="does not support bool input"):
        na.tensor([True, False]).argmax()
    with pytest.raises(RuntimeError, match="does not support bool input"):
        torch.tensor([True, False]).argmax()
    for bad in (lambda m: m.max(4.0), lambda m: m.max(dim=(0, 1)), lambda m: m.max(1, True, 3)):
        with pytest.raises(TypeError):
            bad(t)
        with pytest.raises(TypeError, match="max"):
            bad(x)
