"""torch's ``narrow`` (a view, with gradient), ``view_as`` and the ``new_*`` factories
(``new_zeros``, ``new_ones``, ``new_full``, ``new_empty``, ``new_tensor``: self's dtype and
device unless given) on ``Tensor`` and as ``torch.narrow``, against torch."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import neural_arch as na

pytestmark = pytest.mark.timeout(60)

GRID = np.arange(12.0).reshape(3, 4)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _same(ours, theirs):
    theirs = theirs.detach().numpy()
    assert tuple(ours.shape) == theirs.shape
    assert ours.dtype == theirs.dtype, (ours.dtype, theirs.dtype)
    np.testing.assert_array_equal(ours.numpy(), theirs)


@pytest.mark.parametrize("dim, start, length", [(0, 1, 2), (1, -2, 2), (0, 3, 0), (-1, 0, 4),
                                                (1, 1, 2)])
def test_narrow_matches_torch_with_its_gradient(torch, dim, start, length):
    ours_in = na.tensor(GRID, requires_grad=True)
    theirs_in = torch.tensor(GRID, requires_grad=True)
    ours, theirs = ours_in.narrow(dim, start, length), theirs_in.narrow(dim, start, length)
    _same(ours, theirs)
    _same(na.narrow(ours_in, dim, start, length), torch.narrow(theirs_in, dim, start, length))
    weights = np.random.default_rng(3).standard_normal(tuple(ours.shape))
    (ours * weights).sum().backward()
    (theirs * torch.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(ours_in.grad, theirs_in.grad.numpy())


def test_narrow_is_a_view_sharing_memory_and_version(torch):
    x = na.tensor(GRID)
    piece = x.narrow(1, 1, 2)
    assert np.shares_memory(piece.array, x.array)
    with na.no_grad():
        piece.zero_()
    assert x.numpy()[:, 1:3].sum() == 0 and x._version == piece._version == 1
    # a 0-d tensor as start, as torch takes
    _same(na.tensor(GRID).narrow(0, na.tensor(1), 2),
          torch.tensor(GRID).narrow(0, torch.tensor(1), 2))


def test_narrow_errors_as_torch(torch):
    cases = [((0, 4, 0), IndexError, r"start out of range \(expected to be in range of "
                                     r"\[-3, 3\], but got 4\)"),
             ((0, -4, 1), IndexError, r"start out of range"),
             ((0, 2, 2), RuntimeError, r"start \(2\) \+ length \(2\) exceeds dimension size "
                                       r"\(3\)"),
             ((0, 1, -1), RuntimeError, "length must be non-negative"),
             ((2, 0, 1), IndexError, r"Dimension out of range \(expected to be in range of "
                                     r"\[-2, 1\], but got 2\)"),
             ((0, 1.0, 2), TypeError, "narrow")]
    for args, error, message in cases:
        with pytest.raises(error):
            torch.tensor(GRID).narrow(*args)
        with pytest.raises(error, match=message):
            na.tensor(GRID).narrow(*args)
    with pytest.raises(RuntimeError, match="cannot be applied to a 0-dim tensor"):
        na.tensor(1.0).narrow(0, 0, 1)


@pytest.mark.parametrize("source", [np.float64, np.float32, np.int64])
def test_new_factories_take_self_dtype_unless_given(torch, source):
    ours, theirs = na.tensor(GRID.astype(source)), torch.tensor(GRID.astype(source))
    calls = [lambda t, m: t.new_zeros(2, 3), lambda t, m: t.new_zeros((2, 3)),
             lambda t, m: t.new_zeros([2]), lambda t, m: t.new_zeros(()),
             lambda t, m: t.new_ones(2, dtype=m.int32), lambda t, m: t.new_ones(size=(2,)),
             lambda t, m: t.new_full((2,), 3), lambda t, m: t.new_full((2, 1), 3.7),
             lambda t, m: t.new_full([2], 1, dtype=m.float16),
             lambda t, m: t.new_tensor([1, 2]), lambda t, m: t.new_tensor([1.5, -2.5]),
             lambda t, m: t.new_tensor(3.0), lambda t, m: t.new_zeros(t.size()),
             lambda t, m: t.new_empty((2, 0)).new_zeros(1)]
    for call in calls:
        _same(call(ours, na), call(theirs, torch))
    empty = ours.new_empty(2, 3)
    assert empty.shape == (2, 3) and empty.dtype == ours.dtype


def test_new_factories_requires_grad_device_and_copies(torch):
    x = na.tensor(GRID, requires_grad=True)
    assert not x.new_zeros(2).requires_grad and x.new_zeros(2, requires_grad=True).requires_grad
    assert x.new_tensor([1.0], requires_grad=True).requires_grad
    assert x.new_ones(2).device == x.device == x.new_tensor([1]).device
    assert x.new_zeros(2, device="cpu", dtype=na.float16).dtype == np.float16
    source = np.array([1.0, 2.0])
    copied = x.new_tensor(source)
    source[0] = 9.0
    assert copied.tolist() == [1.0, 2.0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        from_tensor = x.new_tensor(x)
    assert any("sourceTensor.detach().clone()" in str(w.message) for w in caught)
    assert not from_tensor.requires_grad and not np.shares_memory(from_tensor.array, x.array)
    with pytest.raises(TypeError):
        torch.zeros(1).new_zeros()
    with pytest.raises(TypeError, match="new_zeros"):
        x.new_zeros()
    with pytest.raises(TypeError):
        torch.zeros(1).new_zeros(2, 3.0)
    with pytest.raises(TypeError, match="new_zeros"):
        x.new_zeros(2, 3.0)
    with pytest.raises(TypeError):
        torch.zeros(1).new_full(2, 1.0)
    with pytest.raises(TypeError, match="new_full"):
        x.new_full(2, 1.0)


def test_view_as_shares_memory_or_raises_as_view(torch):
    x = na.tensor(GRID, requires_grad=True)
    viewed = x.view_as(na.zeros(4, 3))
    _same(viewed, torch.tensor(GRID).view_as(torch.zeros(4, 3)))
    assert np.shares_memory(viewed.array, x.array)
    viewed.sum().backward()
    np.testing.assert_array_equal(x.grad, np.ones((3, 4)))
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        na.tensor(GRID).t().view_as(na.zeros(12))
    with pytest.raises(RuntimeError):
        torch.tensor(GRID).view_as(torch.zeros(5))
    with pytest.raises((RuntimeError, ValueError)):
        na.tensor(GRID).view_as(na.zeros(5))


def test_new_tensors_of_a_parameter_are_plain_tensors(torch):
    from neural_arch import nn
    weight = nn.Parameter(np.ones((2, 3), dtype=np.float32))
    for made in (weight.new_zeros(4, 5), weight.new_ones(2), weight.new_full((1,), 2.0),
                 weight.new_empty(3), weight.new_tensor([1.0])):
        assert type(made) is na.Tensor and made.dtype == np.float32
        assert not made.requires_grad
    assert type(torch.nn.Parameter(torch.ones(2)).new_zeros(3)) is torch.Tensor
