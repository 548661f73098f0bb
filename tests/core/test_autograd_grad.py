"""``autograd.grad`` (``torch.autograd.grad``): gradients handed back, no ``.grad`` touched."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.core import Tensor, autograd

pytestmark = pytest.mark.timeout(120)


def test_autograd_grad_equals_backward_and_leaves_grad_alone():
    rng = np.random.default_rng(7)
    w = Tensor(rng.standard_normal((3, 4)), requires_grad=True)
    b = Tensor(rng.standard_normal(4), requires_grad=True)
    x = Tensor(rng.standard_normal((5, 3)), requires_grad=True)
    other = Tensor(rng.standard_normal(4), requires_grad=True)
    seed = rng.standard_normal((5, 4))

    def graph():
        h = (x @ w + b).tanh()
        return h, h * other

    h, y = graph()
    y.backward(seed)
    want = [w.grad.array.copy(), b.grad.array.copy(), x.grad.array.copy()]
    sentinel = {t: np.full(t.shape, 7.0) for t in (w, b, x, other)}
    fired = []
    for t in (w, b, x, other):
        t.grad = sentinel[t].copy()
        t.register_post_accumulate_grad_hook(lambda t: fired.append(t))
    h, y = graph()
    got = autograd.grad(y, [w, b, x], grad_outputs=seed)
    for g, expected in zip(got, want):
        np.testing.assert_allclose(g, expected, rtol=1e-12)
    for t in (w, b, x, other):
        np.testing.assert_array_equal(t.grad, sentinel[t])  # untouched
    assert fired == []
    # a non-leaf input: d y / d h, and an input the outputs do not reach
    (gh,) = autograd.grad([y], [h], [seed])
    np.testing.assert_allclose(gh, seed * other.array)
    unused = Tensor(np.ones(2), requires_grad=True)
    assert autograd.grad(y, [unused, b], seed, allow_unused=True)[0] is None
    with pytest.raises(RuntimeError, match=r"input 0 \(shape \(2,\)\) is not reached"):
        autograd.grad(y, [unused], seed)
    with pytest.raises(RuntimeError, match=r"input 0 \(shape \(3,\)\) does not require grad"):
        autograd.grad(y, [Tensor(np.ones(3))], seed)
    with pytest.raises(TypeError, match="inputs must be a Tensor or a sequence of Tensors, "
                                        "got ndarray"):
        autograd.grad(y, np.ones(3), seed)


def test_autograd_grad_matches_finite_differences():
    rng = np.random.default_rng(8)
    w = Tensor(rng.standard_normal((3, 3)), requires_grad=True)

    def loss(weights):
        return ((Tensor(np.eye(3)) @ weights).tanh() ** 3).sum()

    (got,) = autograd.grad(loss(w), [w])
    eps, numeric = 1e-6, np.zeros((3, 3))
    for index in np.ndindex(3, 3):
        for sign in (1, -1):
            shifted = w.array.copy()
            shifted[index] += sign * eps
            numeric[index] += sign * loss(Tensor(shifted)).item() / (2 * eps)
    np.testing.assert_allclose(got, numeric, rtol=1e-6, atol=1e-8)


def test_several_outputs_sum_their_gradients():
    rng = np.random.default_rng(9)
    w = Tensor(rng.standard_normal((2, 2)), requires_grad=True)
    a, b = w.tanh(), w * w  # b's graph does not go through a
    (a.sum() * 2.0 + (b * 3.0).sum()).backward()
    want = w.grad.array.copy()
    w.grad = None
    (got,) = autograd.grad([a, b], [w], [np.full((2, 2), 2.0), np.full((2, 2), 3.0)])
    np.testing.assert_allclose(got, want, rtol=1e-12)
    assert w.grad is None
    with pytest.raises(ValueError, match="grad\\(\\): 1 grad_outputs for 2 outputs"):
        autograd.grad([a, b], [w], [np.ones((2, 2))])


def test_grad_inside_a_backward_is_a_backward_of_its_own():
    # a hook of the outer backward differentiates another graph: callbacks queued inside run at
    # the end of the inner one, and the outer one goes on as it was
    w = Tensor(np.ones(3), requires_grad=True)
    v = Tensor(np.full(3, 2.0), requires_grad=True)
    events = []

    def hook(grad):
        outer = autograd.current_backward()
        inner_out = (v * v).sum()

        def inner_hook(g):
            events.append(("inner", autograd.current_backward() != outer))
            autograd.queue_callback(lambda: events.append(("inner callback",)))

        inner_out.register_hook(inner_hook)
        (gv,) = autograd.grad(inner_out, [v])
        events.append(("result", gv.tolist(), autograd.current_backward() == outer))
        return None

    y = w * 5.0
    y.register_hook(hook)
    y.sum().backward()
    assert events == [("inner", True), ("inner callback",), ("result", [4.0, 4.0, 4.0], True)]
    np.testing.assert_array_equal(w.grad, np.full(3, 5.0))
    assert v.grad is None
