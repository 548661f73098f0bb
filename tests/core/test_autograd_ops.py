"""Finite-difference checks of every Tensor operation, on fresh random float64 inputs."""
import numpy as np
import pytest

import neural_arch as na
from neural_arch import Tensor, gradcheck

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng()  # unseeded on purpose: every run checks new inputs


def leaf(*shape, low=-2.0, high=2.0):
    return Tensor(RNG.uniform(low, high, shape), requires_grad=True)


def positive(*shape):
    return leaf(*shape, low=0.5, high=2.0)


def away_from_zero(*shape):
    values = RNG.uniform(0.2, 2.0, shape) * RNG.choice([-1.0, 1.0], shape)
    return Tensor(values, requires_grad=True)


BINARY = {
    "add": lambda a, b: a + b,
    "sub": lambda a, b: a - b,
    "mul": lambda a, b: a * b,
    "div": lambda a, b: a / b,
}


@pytest.mark.parametrize("name", sorted(BINARY))
@pytest.mark.parametrize("shapes", [((3, 4), (3, 4)), ((3, 4), (4,)), ((4,), (3, 4)),
                                    ((2, 1, 4), (3, 1)), ((1,), (2, 3)), ((), (2, 3))])
def test_binary_ops_with_broadcasting_both_ways(name, shapes):
    a, b = positive(*shapes[0]), positive(*shapes[1])
    assert gradcheck(BINARY[name], [a, b])


@pytest.mark.parametrize("fn", [
    lambda a: 2.0 - a, lambda a: 1.5 / a, lambda a: a ** 2, lambda a: a ** 3,
    lambda a: a ** 0.5, lambda a: a ** -1.5, lambda a: 2.0 ** a, lambda a: -a,
    lambda a: 3 + a, lambda a: 3 * a, lambda a: a - 1, lambda a: a / 4,
])
def test_scalar_on_either_side(fn):
    assert gradcheck(fn, [positive(3, 2)])


def test_tensor_power_tensor():
    assert gradcheck(lambda a, b: a ** b, [positive(3, 4), leaf(4)])


def test_numpy_array_on_the_left_uses_tensor_ops():
    b = positive(3)
    constant = RNG.uniform(1, 2, (2, 3))
    out = constant * b
    assert isinstance(out, Tensor)
    assert gradcheck(lambda t: constant / t + constant - t, [b])


@pytest.mark.parametrize("fn,make", [
    (lambda a: a.exp(), leaf), (lambda a: a.log(), positive), (lambda a: a.tanh(), leaf),
    (lambda a: a.sqrt(), positive), (lambda a: a.relu(), away_from_zero),
    (lambda a: a.sigmoid(), leaf), (lambda a: a.abs(), away_from_zero),
    (lambda a: a.clip(-1.0, 1.0), leaf), (lambda a: a.clip(min=0.1), leaf),
    (lambda a: a.clip(max=0.3), leaf),
])
def test_unary_ops(fn, make):
    assert gradcheck(fn, [make(4, 3)])


@pytest.mark.filterwarnings("error")
def test_sigmoid_is_stable_for_large_inputs():
    x = Tensor(np.array([-1000.0, -30.0, 0.0, 30.0, 1000.0]))
    expected = np.exp(-np.logaddexp(0.0, -x.array))
    np.testing.assert_allclose(x.sigmoid().array, expected, rtol=1e-12, atol=0)


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (None, True), (0, False), (1, True),
                                           (-1, False), ((0, 2), False), ((0, 2), True)])
def test_reductions(op, axis, keepdims):
    x = leaf(3, 4, 5)
    out = getattr(x, op)(axis=axis, keepdims=keepdims)
    np.testing.assert_allclose(out.array, getattr(np, op if op in ("sum", "mean") else "a" + op)(
        x.array, axis=axis, keepdims=keepdims))
    assert gradcheck(lambda t: getattr(t, op)(axis=axis, keepdims=keepdims), [x])


def test_max_splits_gradient_between_ties():
    x = Tensor(np.array([1.0, 3.0, 3.0, 2.0]), requires_grad=True)
    x.max().backward()
    np.testing.assert_allclose(x.grad, [0, 0.5, 0.5, 0])


@pytest.mark.parametrize("kwargs,ddof", [({}, 1), ({"correction": 0}, 0), ({"unbiased": False}, 0),
                                         ({"ddof": 1}, 1)])
def test_var_and_std(kwargs, ddof):
    x = leaf(4, 5)
    np.testing.assert_allclose(x.var(axis=1, **kwargs).array, np.var(x.array, axis=1, ddof=ddof))
    np.testing.assert_allclose(x.std(**kwargs).array, np.std(x.array, ddof=ddof))
    assert gradcheck(lambda t: t.var(axis=0, keepdims=True, **kwargs), [x])
    assert gradcheck(lambda t: t.std(**kwargs), [x])


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((4,), (4, 5)), ((3, 4), (4,)),
                                    ((4,), (4,)), ((2, 3, 4), (4, 5)), ((2, 3, 4), (2, 4, 5)),
                                    ((4,), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)),
                                    ((2, 3, 4), (4,))])
def test_matmul_shapes(shapes):
    a, b = leaf(*shapes[0]), leaf(*shapes[1])
    np.testing.assert_allclose((a @ b).array, a.array @ b.array)
    assert gradcheck(lambda x, y: x @ y, [a, b])
    assert gradcheck(lambda x, y: x.matmul(y), [a, b])


def test_matmul_with_array_operands():
    a = leaf(3, 4)
    constant = RNG.standard_normal((4, 2))
    assert gradcheck(lambda t: t @ constant, [a])
    assert gradcheck(lambda t: constant.T @ t.T, [a])


@pytest.mark.parametrize("fn", [
    lambda t: t.reshape(4, 6), lambda t: t.reshape((2, -1)), lambda t: t.view(-1),
    lambda t: t.transpose(), lambda t: t.transpose(0, 2), lambda t: t.transpose(-1, -2),
    lambda t: t.transpose((1, 2, 0)), lambda t: t.permute(2, 0, 1), lambda t: t.T,
    lambda t: t.unsqueeze(0), lambda t: t.unsqueeze(-1), lambda t: t.unsqueeze(1).squeeze(1),
    lambda t: t.reshape(2, 1, 3, 4).squeeze(), lambda t: t.flatten(),
    lambda t: t.flatten(1), lambda t: t.flatten(0, 1), lambda t: t[:, :1].expand(2, 3, 4),
    lambda t: t[0].expand(5, 3, 4), lambda t: t[:, :1].broadcast_to((2, 3, 4)),
    lambda t: t.swapaxes(0, 1),
])
def test_shape_ops(fn):
    x = leaf(2, 3, 4)
    assert gradcheck(fn, [x])


@pytest.mark.parametrize("index", [
    1, -1, slice(None, None, 2), (slice(None), 0), (Ellipsis, 1), (None, 0, slice(1, 3)),
    (slice(None), slice(None), np.array([0, 2, 2, 3, 0])), np.array([1, 1, 0]),
    (np.array([0, 1, 1]), np.array([2, 0, 2])), (slice(None), [1, 1, 2]),
])
def test_indexing(index):
    x = leaf(2, 3, 4)
    np.testing.assert_allclose(x[index].array, x.array[index])
    assert gradcheck(lambda t: t[index], [x])


def test_boolean_mask_indexing():
    x = leaf(4, 5)
    mask = x.array > 0
    assert gradcheck(lambda t: t[mask], [x])
    assert gradcheck(lambda t: t[Tensor(mask)], [x])


def test_repeated_integer_indices_accumulate():
    x = Tensor(np.arange(4.0), requires_grad=True)
    x[np.array([0, 0, 2, 0])].sum().backward()
    np.testing.assert_array_equal(x.grad, [3.0, 0.0, 1.0, 0.0])


def test_concatenate_stack_where_masked_fill():
    a, b, c = leaf(2, 3), leaf(2, 1), leaf(2, 3)
    assert gradcheck(lambda x, y: na.concatenate([x, y], axis=1), [a, b])
    assert gradcheck(lambda x, y: na.cat([x, y, x], axis=-1), [a, b])
    assert gradcheck(lambda x, y: na.stack([x, y], axis=1), [a, c])
    assert gradcheck(lambda x, y: na.stack([x, y, x], axis=-1), [a, c])
    cond = RNG.random((2, 3)) > 0.5
    assert gradcheck(lambda x, y: na.where(cond, x, y), [a, b])
    assert gradcheck(lambda x: na.where(Tensor(cond), x, 0.0), [a])
    assert gradcheck(lambda x: x.masked_fill(cond, -5.0), [a])
    assert gradcheck(lambda x: x.masked_fill(cond[:1], 1.0), [a])
    np.testing.assert_array_equal(a.masked_fill(cond, -5.0).array, np.where(cond, -5.0, a.array))


def test_non_contiguous_views_as_inputs():
    transposed = Tensor(RNG.standard_normal((6, 8)).T, requires_grad=True)
    strided = Tensor(RNG.standard_normal((6, 8))[::2, 1::3], requires_grad=True)
    assert not transposed.array.flags.c_contiguous and not strided.array.flags.c_contiguous
    assert gradcheck(lambda t: (t * t).sum(axis=0) + t.exp().mean(), [transposed])
    assert gradcheck(lambda s, t: s @ t[:3, :2], [strided, transposed])
    out = strided @ transposed[:3, :2]
    out.backward(np.ones((3, 2)))
    np.testing.assert_allclose(strided.grad, np.ones((3, 2)) @ transposed.array[:3, :2].T)


def test_node_reused_many_times():
    x = leaf(3)
    assert gradcheck(lambda t: t * t * t + t, [x])
    x.grad = None
    (x * x * x + x).sum().backward()
    np.testing.assert_allclose(x.grad, 3 * x.array ** 2 + 1)


def test_same_tensor_on_both_sides():
    x = leaf(2, 3)
    for fn in (lambda t: t + t, lambda t: t - t, lambda t: t * t, lambda t: t / t,
               lambda t: t @ t.T, lambda t: na.stack([t, t])):
        assert gradcheck(fn, [x])


def test_composite_expression():
    def fn(x, w, b):
        h = (x @ w + b).tanh()
        return (h.exp() / h.exp().sum(axis=1, keepdims=True)).log().mean()
    assert gradcheck(fn, [leaf(4, 3), leaf(3, 5), leaf(5)])
