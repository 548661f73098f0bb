"""The backward engine: accumulation, hooks, grad modes, deep graphs, dtypes and aliasing."""
import numpy as np
import pytest

import neural_arch as na
import neural_arch.functional as F
from neural_arch import Tensor

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng()


def test_gradients_accumulate_across_backward_calls_until_zeroed():
    x = Tensor(RNG.standard_normal(3), requires_grad=True)
    y = (x * x).sum()
    y.backward()
    y.backward()
    np.testing.assert_allclose(x.grad, 4 * x.array)
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad, 4 * x.array + 3)
    x.zero_grad()
    assert x.grad is None
    (x * 3).sum().backward()
    np.testing.assert_allclose(x.grad, [3.0, 3.0, 3.0])


def test_non_leaf_keeps_grad_only_with_retain_grad():
    x = Tensor(RNG.standard_normal(3), requires_grad=True)
    hidden = x * 2
    kept = x * 3
    kept.retain_grad()
    (hidden * kept).sum().backward()
    assert hidden.grad is None and not hidden.is_leaf
    np.testing.assert_allclose(kept.grad, 2 * x.array)
    np.testing.assert_allclose(x.grad, 12 * x.array)


def test_backward_errors():
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0, 2.0]).sum().backward()
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(RuntimeError, match=r"only for scalar outputs; got shape \(2, 3\)"):
        (x * 2).backward()
    with pytest.raises(ValueError, match=r"gradient shape \(3, 2\) does not match tensor shape "
                                         r"\(2, 3\)"):
        (x * 2).backward(np.ones((3, 2)))
    (x * 2).backward(np.full((2, 3), 0.5))
    np.testing.assert_allclose(x.grad, np.ones((2, 3)))


def test_user_gradient_array_is_never_modified():
    x = Tensor(np.ones(3), requires_grad=True)
    seed = np.array([1.0, 2.0, 3.0])
    x.backward(seed)
    x.backward(seed)
    (x + 0).backward(seed)
    np.testing.assert_array_equal(seed, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(x.grad, 3 * seed)


def test_pass_through_gradients_do_not_alias_between_leaves():
    a = Tensor(np.zeros(3), requires_grad=True)
    b = Tensor(np.zeros(3), requires_grad=True)
    c = Tensor(np.zeros(3), requires_grad=True)
    (a + b + c.reshape(3)).sum().backward()
    (a + b + c.reshape(3)).sum().backward()
    a.grad += 10  # an in-place update of one gradient must not leak into the others
    np.testing.assert_array_equal(b.grad, [2, 2, 2])
    np.testing.assert_array_equal(c.grad, [2, 2, 2])
    assert not np.shares_memory(a.grad.array, b.grad.array)


def test_no_grad_enable_grad_and_decorator():
    x = Tensor([1.0], requires_grad=True)
    with na.no_grad():
        assert not na.is_grad_enabled()
        y = x * 2
        with na.enable_grad():
            z = x * 2
    assert na.is_grad_enabled()
    assert not y.requires_grad and y.is_leaf and z.requires_grad

    @na.no_grad()
    def inference(t):
        return t.exp()

    assert not inference(x).requires_grad and na.is_grad_enabled()
    with pytest.raises(ZeroDivisionError):
        with na.no_grad():
            1 / 0
    assert na.is_grad_enabled()


def test_detach_stops_gradient():
    x = Tensor([2.0], requires_grad=True)
    (x * x.detach()).sum().backward()
    np.testing.assert_allclose(x.grad, [2.0])


def test_hook_sees_complete_gradient_once_and_can_replace_it():
    x = Tensor(RNG.standard_normal(4), requires_grad=True)
    mid = x * 2
    seen = []
    mid.register_hook(lambda g: seen.append(g.clone()))
    (mid * 3 + mid * mid + mid.sum()).sum().backward()
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 3 + 2 * mid.array + 4)

    x.grad = None
    handle = mid.register_hook(lambda g: g * 0 + 1.0)
    (mid * 5).sum().backward()
    np.testing.assert_allclose(x.grad, np.full(4, 2.0))
    handle.remove()
    x.grad = None
    (mid * 5).sum().backward()
    np.testing.assert_allclose(x.grad, np.full(4, 10.0))
    assert len(seen) == 3


def test_leaf_hook_runs_before_accumulation():
    w = Tensor(np.ones(3), requires_grad=True)
    w.grad = np.full(3, 100.0)
    seen = []
    w.register_hook(lambda g: seen.append(g.clone()) or g * 2)
    (w * 3).sum().backward()
    np.testing.assert_allclose(seen[0], np.full(3, 3.0))
    np.testing.assert_allclose(w.grad, np.full(3, 106.0))


def test_post_accumulate_hooks_run_after_grad_update_in_reverse_layer_order():
    layers = [Tensor(RNG.standard_normal((4, 4)) * 0.3, requires_grad=True) for _ in range(3)]
    order, grads_at_call = [], []
    for index, weight in enumerate(layers):
        def hook(tensor, index=index):
            order.append(index)
            grads_at_call.append(tensor.grad.array.copy())
        weight.register_post_accumulate_grad_hook(hook)
    h = Tensor(RNG.standard_normal((2, 4)))
    for weight in layers:
        h = F.linear(h, weight).tanh()
    h.sum().backward()
    assert order == [2, 1, 0]
    for index, grad in zip(order, grads_at_call):
        np.testing.assert_array_equal(grad, layers[index].grad)
    with pytest.raises(RuntimeError, match="leaf tensors that require grad"):
        (layers[0] * 2).register_post_accumulate_grad_hook(lambda t: None)
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor([1.0]).register_hook(lambda g: g)


def test_ten_thousand_op_chain_has_no_recursion_limit():
    x = Tensor(np.array([0.5]), requires_grad=True)
    y = x
    for _ in range(10_000):
        y = y * 1.0001 + 0.0
    y.sum().backward()
    np.testing.assert_allclose(x.grad, [1.0001 ** 10_000], rtol=1e-9)
    del y  # freeing the long chain must not overflow the C stack either


def test_wide_reuse_visits_node_once():
    x = Tensor(np.array([1.5]), requires_grad=True)
    shared = x * 2
    calls = []
    shared.register_hook(lambda g: calls.append(1))
    total = shared
    for _ in range(2000):
        total = total + shared
    total.sum().backward()
    assert len(calls) == 1
    np.testing.assert_allclose(x.grad, [2 * 2001])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_dtype_is_preserved_end_to_end(dtype):
    x = Tensor(RNG.standard_normal((4, 5)).astype(dtype), requires_grad=True)
    w = Tensor(RNG.standard_normal((3, 5)).astype(dtype), requires_grad=True)
    labels = Tensor([0, 2, 1, 2])
    out = F.cross_entropy(F.gelu(F.linear(x, w)) * 0.5 + 1.0, labels)
    assert out.dtype == dtype and labels.dtype == np.int64
    out.backward()
    assert x.grad.dtype == dtype and w.grad.dtype == dtype
    mixed = (x * np.ones(5, dtype=np.float64)).sum()
    x.grad = None
    mixed.backward()
    assert x.grad.dtype == dtype


def test_float16_tensors_work():
    x = Tensor(np.array([0.5, -1.0], dtype=np.float16), requires_grad=True)
    y = (x * x).sum()
    assert y.dtype == np.float16
    y.backward()
    assert x.grad.dtype == np.float16
    np.testing.assert_allclose(x.grad, [1.0, -2.0])


def test_hook_returning_wrong_shape_is_rejected():
    x = Tensor(np.ones(3), requires_grad=True)
    y = x * 2
    y.register_hook(lambda g: np.ones(4))
    with pytest.raises(ValueError, match=r"a tensor hook returned a gradient of shape \(4,\) "
                                         r"for a tensor of shape \(3,\)"):
        y.sum().backward()


def test_power_zero_has_zero_gradient_even_at_zero():
    x = Tensor(np.array([0.0, 2.0]), requires_grad=True)
    (x ** 0).sum().backward()
    np.testing.assert_array_equal(x.grad, [0.0, 0.0])


def test_make_result_defines_a_new_operation():
    from neural_arch.core.tensor import make_result

    def cube(t):
        data = t.array ** 3
        return make_result(data, (t,), lambda g: (g * 3 * t.array ** 2,))

    x = Tensor(RNG.standard_normal(4), requires_grad=True)
    assert na.gradcheck(cube, [x])
    with na.no_grad():
        assert not cube(x).requires_grad


def test_zero_dimensional_leaf_gets_an_array_gradient():
    x = Tensor(np.float64(2.0), requires_grad=True)
    (x * 3.0).backward()
    (x * x).backward()
    assert isinstance(x.grad.array, np.ndarray) and x.grad.shape == ()
    assert x.grad == 3.0 + 4.0
