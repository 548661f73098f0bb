"""torch's Tensor methods on ``Tensor`` (``import neural_arch as torch``): sizes, in-place ops
and their autograd rules, shape methods, gather/scatter, conversions; values and gradients
against torch."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import neural_arch as na

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(7)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def check(torch, ours_fn, theirs_fn, *arrays, tol=1e-12):
    """Same values and the same gradients (of a random weighting) for every input."""
    ours_in = [na.tensor(a, requires_grad=True) for a in arrays]
    theirs_in = [torch.tensor(a, requires_grad=True) for a in arrays]
    ours, theirs = ours_fn(*ours_in), theirs_fn(*theirs_in)
    if not isinstance(ours, tuple):
        ours, theirs = (ours,), (theirs,)
    assert len(ours) == len(theirs)
    total_ours, total_theirs = 0, 0
    for o, t in zip(ours, theirs):
        assert tuple(o.size()) == tuple(t.size())
        np.testing.assert_allclose(o.numpy(), t.detach().numpy(), rtol=tol, atol=tol)
        weights = RNG.standard_normal(tuple(o.shape))
        total_ours = total_ours + (o * weights).sum()
        total_theirs = total_theirs + (t * torch.tensor(weights)).sum()
    total_ours.backward()
    total_theirs.backward()
    for a, b in zip(ours_in, theirs_in):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=tol, atol=tol)


# ----------------------------------------------------------------------------- sizes
def test_size_numel_dim_and_the_size_type(torch):
    x = na.zeros(2, 3, 4)
    assert x.size() == (2, 3, 4) and isinstance(x.size(), na.Size)
    assert x.size(-1) == 4 and x.size(0) == 2 and type(x.size(1)) is int
    assert x.numel() == x.nelement() == 24 and x.dim() == x.ndim == 3
    assert x.element_size() == 4 and na.zeros(2, dtype=na.float64).element_size() == 8
    assert na.tensor(5.0).size() == () and na.tensor(5.0).numel() == 1
    size = x.size()
    assert repr(size) == "Size([2, 3, 4])" and size.numel() == 24
    assert isinstance(size[1:], na.Size) and size[1:] == (3, 4)
    assert isinstance(size + (5,), na.Size) and (1,) + size == (1, 2, 3, 4)
    assert pickle.loads(pickle.dumps(size)) == size
    with pytest.raises(IndexError, match=r"range of \[-3, 2\], but got 3"):
        x.size(3)
    t = torch.zeros(2, 3, 4)
    assert tuple(t.size()) == tuple(x.size()) and t.element_size() == x.element_size()


def test_torch_style_attention_reshape(torch):
    data = RNG.standard_normal((2, 5, 8))
    heads = 2

    def split_heads(x):  # the same code runs on both libraries
        B, T, C = x.size()
        heads_first = x.view(B, T, heads, C // heads).transpose(1, 2).contiguous()
        return heads_first.view(B * heads, T, -1)

    check(torch, split_heads, split_heads, data)


# ----------------------------------------------------------------------------- in-place
def test_in_place_on_a_leaf_that_requires_grad_raises_as_in_torch(torch):
    w = na.zeros(3, requires_grad=True)
    for call in (lambda: w.add_(1.0), lambda: w.zero_(), lambda: w.normal_(),
                 lambda: w.fill_(2.0), lambda: w.copy_(na.ones(3)), lambda: w.clamp_(0, 1)):
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
            call()
    with pytest.raises(RuntimeError, match="leaf Variable"):
        torch.zeros(3, requires_grad=True).add_(1.0)
    hidden = w * 2
    assert hidden.mul_(2.0).requires_grad  # not a leaf: recorded, as torch
    assert na.zeros(3).add_(w).requires_grad  # an argument requires grad: recorded
    assert not w.array.any()


def test_in_place_under_no_grad_writes_into_data(torch):
    w = na.zeros(2, 3, requires_grad=True)
    data = w.array
    with na.no_grad():
        assert w.fill_(2.0) is w
        w.add_(na.ones(3), alpha=3).sub_(1.0).mul_(na.tensor([1.0, 2.0, 3.0])).div_(2.0)
        w.clamp_(max=7.0).masked_fill_(na.tensor([True, False, False]), -1.0)
    t = torch.zeros(2, 3)
    t.fill_(2.0).add_(torch.ones(3), alpha=3).sub_(1.0).mul_(torch.tensor([1.0, 2.0, 3.0]))
    t.div_(2.0).clamp_(max=7.0).masked_fill_(torch.tensor([True, False, False]), -1.0)
    np.testing.assert_allclose(w.numpy(), t.numpy())
    assert w.array is data and w.requires_grad and w.is_leaf
    with na.no_grad():
        w.copy_(np.arange(3.0)).zero_()
    assert w.array is data and not data.any()
    (w * 2).sum().backward()  # the leaf still trains
    np.testing.assert_allclose(w.grad, np.full((2, 3), 2.0))


def test_in_place_dtype_shape_and_rounding_rules(torch):
    ints = na.tensor([7, -7, 5])
    with pytest.raises(RuntimeError, match="cannot be cast to the tensor's dtype int64"):
        ints.add_(1.5)
    with pytest.raises(RuntimeError, match=r"output with shape \(3,\)"):
        na.zeros(3).add_(na.ones(2, 3))
    with pytest.raises(RuntimeError, match="boolean masks"):
        na.zeros(3).masked_fill_(na.tensor([1, 0, 1]), 1.0)
    for mode in ("floor", "trunc"):
        ours = na.tensor([7, -7, 5]).div_(2, rounding_mode=mode)
        theirs = torch.tensor([7, -7, 5]).div_(2, rounding_mode=mode)
        np.testing.assert_array_equal(ours.numpy(), theirs.numpy())
    copied = na.zeros(2, 3, dtype=na.float32).copy_(na.tensor([1, 2, 3]))
    assert copied.dtype == np.float32 and copied.tolist() == [[1, 2, 3], [1, 2, 3]]


def test_random_fills_follow_the_generator_and_the_bounds():
    first = na.zeros(4000).normal_(1.0, 0.5, generator=na.Generator().manual_seed(3))
    again = na.zeros(4000).normal_(1.0, 0.5, generator=na.Generator().manual_seed(3))
    np.testing.assert_array_equal(first.numpy(), again.numpy())
    assert abs(first.numpy().mean() - 1.0) < 0.05 and abs(first.numpy().std() - 0.5) < 0.05
    u = na.zeros(4000, dtype=na.float64).uniform_(-2.0, 3.0)
    assert u.dtype == np.float64 and -2.0 <= u.numpy().min() and u.numpy().max() < 3.0
    assert na.zeros(10).uniform_(**{"from": 5.0, "to": 6.0}).numpy().min() >= 5.0
    with pytest.raises(RuntimeError, match="floating point"):
        na.zeros(3, dtype=na.long).normal_()
    w = na.zeros(3, requires_grad=True)
    with na.no_grad():
        w.normal_(0, 0.02)
    assert w.requires_grad and w.array.any()


# ----------------------------------------------------------------------------- shapes
@pytest.mark.parametrize("name, ours, theirs", [
    ("t", lambda x: x.t(), lambda x: x.t()),
    ("repeat", lambda x: x.repeat(2, 1, 3), lambda x: x.repeat(2, 1, 3)),
    ("expand", lambda x: x[:1].expand(4, -1), lambda x: x[:1].expand(4, -1)),
    ("permute", lambda x: x.permute(1, 0), lambda x: x.permute(1, 0)),
    ("flatten", lambda x: x.unsqueeze(0).flatten(1), lambda x: x.unsqueeze(0).flatten(1)),
    ("squeeze", lambda x: x.unsqueeze(1).squeeze(1), lambda x: x.unsqueeze(1).squeeze(1)),
    ("chunk", lambda x: x.chunk(2, 1), lambda x: x.chunk(2, 1)),
    ("chunk7", lambda x: x.view(-1).chunk(3), lambda x: x.view(-1).chunk(3)),
    ("split", lambda x: x.split(2, -1), lambda x: x.split(2, -1)),
    ("split_sizes", lambda x: x.split([1, 3], 0), lambda x: x.split([1, 3], 0)),
    ("unbind", lambda x: x.unbind(1), lambda x: x.unbind(1)),
    ("contiguous", lambda x: x.t().contiguous(), lambda x: x.t().contiguous()),
])
def test_shape_methods_values_and_grads(torch, name, ours, theirs):
    check(torch, ours, theirs, RNG.standard_normal((4, 5)))


def test_shape_method_errors():
    x = na.zeros(2, 3, 4)
    with pytest.raises(RuntimeError, match="t\\(\\) expects a tensor with <= 2 dimensions"):
        x.t()
    with pytest.raises(RuntimeError, match="can not be smaller"):
        x.repeat(2, 2)
    with pytest.raises(RuntimeError, match="sum exactly to 2"):
        x.split([1, 2])
    with pytest.raises(IndexError, match="dim 3 is out of range"):
        x.chunk(2, 3)
    assert x.contiguous() is x and na.zeros(3).t().shape == (3,)


def test_gather_scatter_and_scatter_add(torch):
    data, src = RNG.standard_normal((3, 4)), RNG.standard_normal((3, 5))
    index = np.array([[0, 2, 1, 2], [1, 1, 0, 0]])  # repeats along dim 0 and dim 1
    for dim in (0, 1):
        ti, ni = torch.tensor(index), na.tensor(index)
        check(torch, lambda x: x.gather(dim, ni), lambda x: x.gather(dim, ti), data)
        check(torch, lambda x, s: x.scatter_add(dim, ni, s),
              lambda x, s: x.scatter_add(dim, ti, s), data, src[:2, :4])
    # a src larger than index: only its leading block is used (torch's backward rejects it)
    big = na.tensor(src, requires_grad=True)
    added = na.tensor(data).scatter_add(1, na.tensor(index), big)
    np.testing.assert_allclose(added.numpy(), torch.tensor(data).scatter_add(
        1, torch.tensor(index), torch.tensor(src)).numpy())
    added.sum().backward()
    assert big.grad[:2, :4].tolist() == [[1.0] * 4] * 2 and not big.grad[2:].any()
    unique = np.array([[2, 0, 1, 0], [0, 1, 2, 2]])  # no place written twice along dim 0
    check(torch, lambda x, s: x.scatter(0, na.tensor(unique), s),
          lambda x, s: x.scatter(0, torch.tensor(unique), s), data, src[:2, :4])
    filled = na.tensor(data).scatter(1, na.tensor(index[:, :2]), value=9.0)
    np.testing.assert_allclose(
        filled.numpy(), torch.tensor(data).scatter(1, torch.tensor(index[:, :2]), 9.0).numpy())
    with pytest.raises(RuntimeError, match="index 3 is out of bounds for dimension 0 with size 3"):
        na.tensor(data).gather(0, na.tensor([[3]]))
    with pytest.raises(RuntimeError, match="integer tensor"):
        na.tensor(data).gather(0, na.tensor([[0.0]]))


# ----------------------------------------------------------------------------- conversions
def test_casts_to_and_type_as(torch):
    x = na.tensor([1.5, -2.5], requires_grad=True)
    assert x.int().dtype == np.int32 and x.long().dtype == np.int64
    assert x.bool().dtype == np.bool_ and x.half().dtype == np.float16
    assert x.double().dtype == np.float64 and not x.long().requires_grad
    assert x.type_as(na.zeros(1, dtype=na.float64)).dtype == np.float64
    other = na.zeros(1, dtype=na.float64)
    moved = x.to(other)
    assert moved.dtype == np.float64 and moved.device == "cpu"
    assert x.to("cpu", na.float64).dtype == np.float64 and x.to(dtype=na.half).dtype == np.float16
    assert x.to("cpu") is x and x.to("cpu", copy=True) is not x
    (x.to(na.device("cpu"), na.double) * 3).sum().backward()
    assert x.grad.dtype == np.float32 and x.grad.tolist() == [3.0, 3.0]
    assert x.detach().requires_grad is False and x.clone().requires_grad
    assert na.tensor([[1, 2]]).tolist() == [[1, 2]] and na.tensor([4.0]).item() == 4.0


def test_selection_methods_delegate_to_the_core_functions(torch):
    data = RNG.standard_normal((3, 6))
    check(torch, lambda x: x.topk(2, dim=1).values, lambda x: x.topk(2, dim=1).values, data)
    check(torch, lambda x: x.sort(0, descending=True).values,
          lambda x: x.sort(0, descending=True).values, data)
    assert na.tensor(data).argsort(1).tolist() == torch.tensor(data).argsort(1).tolist()
    mask = data > 0
    check(torch, lambda x, y: x.where(na.tensor(mask), y),
          lambda x, y: x.where(torch.tensor(mask), y), data, data * 2)
    check(torch, lambda x: x.masked_fill(na.tensor(mask), 0.5),
          lambda x: x.masked_fill(torch.tensor(mask), 0.5), data)
