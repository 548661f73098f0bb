"""Callbacks queued during backward run once it has finished (``autograd.queue_callback``)."""
import numpy as np
import pytest

from neural_arch import Tensor
from neural_arch.core import autograd


def two_leaves():
    a = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    b = Tensor(np.array([3.0, 4.0]), requires_grad=True)
    return a, b, ((a * b).sum() + a.sum())


def test_callback_runs_after_every_gradient_once_per_backward():
    a, b, loss = two_leaves()
    seen = []

    def at_end():
        seen.append(("end", a.grad.array.copy(), b.grad.array.copy()))

    def hook(t):
        seen.append(("hook",))
        autograd.queue_callback(at_end)
    a.register_post_accumulate_grad_hook(hook)
    b.register_post_accumulate_grad_hook(hook)
    loss.backward()
    assert [entry[0] for entry in seen] == ["hook", "hook", "end", "end"]
    _, grad_a, grad_b = next(entry for entry in seen if entry[0] == "end")
    np.testing.assert_array_equal(grad_a, [4.0, 5.0])  # both gradients were complete
    np.testing.assert_array_equal(grad_b, [1.0, 2.0])
    seen.clear()
    loss.backward()  # the queue of the first backward is gone: only this one's callbacks run
    assert sum(entry[0] == "end" for entry in seen) == 2


def test_callbacks_may_queue_more_and_run_in_order():
    a, _, loss = two_leaves()
    order = []

    def first():
        order.append(1)
        autograd.queue_callback(lambda: order.append(3))
    a.register_post_accumulate_grad_hook(
        lambda t: (autograd.queue_callback(first), autograd.queue_callback(lambda: order.append(2))))
    loss.backward()
    assert order == [1, 2, 3]


def test_failing_callback_propagates_and_the_queue_is_cleared():
    a, _, loss = two_leaves()
    ran = []

    def boom():
        raise ValueError("callback failed with value 42")
    handle = a.register_post_accumulate_grad_hook(
        lambda t: (autograd.queue_callback(boom), autograd.queue_callback(lambda: ran.append(1))))
    with pytest.raises(ValueError, match="value 42"):
        loss.backward()
    assert ran == [] and autograd.current_backward() is None
    handle.remove()
    loss.backward()  # nothing left over from the failed backward runs now
    assert ran == []
    with pytest.raises(RuntimeError, match="no backward is running"):
        autograd.queue_callback(lambda: None)


def test_failing_hook_also_clears_the_queue():
    a, b, loss = two_leaves()
    ran = []

    def hook(t):
        autograd.queue_callback(lambda: ran.append(1))
        if t is a:
            raise KeyError("hook failed")
    handle_b = b.register_post_accumulate_grad_hook(hook)
    handle_a = a.register_post_accumulate_grad_hook(hook)
    with pytest.raises(KeyError):
        loss.backward()
    handle_a.remove()
    handle_b.remove()
    loss.backward()
    assert ran == [] and autograd.current_backward() is None


def test_current_backward_tells_backwards_apart_and_nests():
    a, _, loss = two_leaves()
    ids = []

    def hook(t):
        ids.append(autograd.current_backward())
        if len(ids) == 1:  # a backward inside a hook has its own id and its own queue
            inner = (Tensor(np.array(2.0), requires_grad=True) * 3)
            inner.backward()
            ids.append(autograd.current_backward())
    a.register_post_accumulate_grad_hook(hook)
    assert autograd.current_backward() is None
    loss.backward()
    loss.backward()
    assert ids[0] is not None and ids[0] == ids[1] and ids[2] not in (None, ids[0])
    with pytest.raises(TypeError, match="callable, got int"):
        autograd.queue_callback(3)


def test_outermost_backward_and_its_queue_from_a_nested_one():
    """A backward run inside another (a node's backward calling ``grad()``) can name the outer
    one and queue for its end, after every node of the outer backward."""
    x = Tensor(np.array(2.0), requires_grad=True)
    events = []

    def nested_backward(g):
        inner = Tensor(np.array(3.0), requires_grad=True)
        out = inner * inner

        def hook(grad):
            events.append(("ids", autograd.current_backward(),
                           autograd.current_backward(outermost=True)))
            autograd.queue_callback(lambda: events.append("inner end"))
            autograd.queue_callback(lambda: events.append("outer end"), outermost=True)
        out.register_hook(hook)
        autograd.grad(out, inner)
        events.append("node done")
        return (g * 5,)

    from neural_arch.core.tensor import make_result
    y = make_result(x.array * 5, (x,), nested_backward)
    outer_id = []
    x.register_post_accumulate_grad_hook(lambda t: outer_id.append(autograd.current_backward()))
    y.backward()
    _, inner, outer = events[0]
    assert inner != outer and outer == outer_id[0]
    assert events[1:] == ["inner end", "node done", "outer end"]
    assert float(x.grad) == 5.0
