"""Version counters and in-place autograd, against torch: ``_version`` counts in-place writes
(shared by ``detach()`` and views); a backward that needs values written over since raises
torch's error; in-place ops on a leaf that requires grad raise; on other tensors they are
recorded, with torch's gradients, also for ops made before the write."""
from __future__ import annotations

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.core import Tensor, no_grad

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(30)

MODIFIED = "modified by an inplace operation.*is at version 1; expected version 0"


def pair(shape=(3, 4), seed=0, dtype=np.float64):
    data = np.random.default_rng(seed).standard_normal(shape).astype(dtype)
    return Tensor(data.copy(), requires_grad=True), torch.tensor(data, requires_grad=True)


def test_version_counts_inplace_writes_and_is_shared_by_detach_and_views():
    ours, theirs = Tensor(np.zeros((2, 3))), torch.zeros(2, 3)
    for t in (ours, theirs):
        t.add_(1)
        t.mul_(2)
        t[0] = 5.0
        t.detach().zero_()
        t.view(6).add_(1)
        t[1].clamp_(0, 1)
    assert ours._version == theirs._version == 6


@pytest.mark.parametrize("case", ["exp", "tanh", "sigmoid", "relu", "softmax", "log_softmax",
                                  "sqrt"])
def test_saved_output_modified_in_place_raises(case):
    x, tx = pair()
    for t, mod in ((x, F), (tx, torch)):
        if case == "sqrt":
            t = t * t
        fn = {"softmax": lambda v: mod.softmax(v, dim=-1),
              "log_softmax": lambda v: mod.log_softmax(v, dim=-1)}.get(case)
        y = fn(t) if fn else getattr(t, case)()
        with (no_grad() if mod is F else torch.no_grad()):
            y.add_(1)
        with pytest.raises(RuntimeError, match=MODIFIED):
            y.sum().backward()


@pytest.mark.parametrize("case", ["matmul", "linear", "mul", "div", "log", "gelu", "clamp"])
def test_saved_input_modified_in_place_raises(case):
    (a, ta), (b, tb) = pair((3, 4)), pair((4, 4), seed=1)
    for x, w, lib in ((a, b, F), (ta, tb, torch.nn.functional)):
        x = x * 1.0  # a non-leaf, so the write below is allowed under grad too
        out = {"matmul": lambda: x @ w, "linear": lambda: lib.linear(x, w),
               "mul": lambda: x * w[:3], "div": lambda: w[:3] / x, "log": lambda: (x * x).log(),
               "gelu": lambda: lib.gelu(x), "clamp": lambda: x.clamp(-0.5, 0.5)}[case]()
        with (no_grad() if lib is F else torch.no_grad()):
            x.mul_(2)
        with pytest.raises(RuntimeError, match=MODIFIED):
            out.sum().backward()


def test_no_error_when_the_write_comes_after_backward_or_on_an_unsaved_tensor():
    x, tx = pair()
    for t in (x, tx):
        y = t * 2
        z = y + 1  # add saves nothing
        with (no_grad() if t is x else torch.no_grad()):
            y.add_(3)
        z.sum().backward()
    np.testing.assert_allclose(x.grad, tx.grad.numpy())


def test_inplace_on_a_leaf_that_requires_grad_raises_as_torch():
    x, tx = pair()
    for t in (x, tx):
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being "
                                               "used in an in-place operation"):
            t.add_(1)
        with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad"):
            t[0].mul_(2)
        with pytest.raises(RuntimeError, match="a leaf Variable that requires grad"):
            t[0] = 1.0
    with no_grad():
        x.add_(1)  # allowed, as torch.no_grad()
    assert x._version == 1


INPLACE = {
    "add_": lambda y, w: y.add_(w, alpha=2), "sub_": lambda y, w: y.sub_(3.0),
    "mul_": lambda y, w: y.mul_(w), "mul_scalar": lambda y, w: y.mul_(3.0),
    "div_": lambda y, w: y.div_(w), "clamp_": lambda y, w: y.clamp_(-0.5, 0.5),
    "zero_": lambda y, w: y.zero_(), "fill_": lambda y, w: y.fill_(2.0),
    "copy_": lambda y, w: y.copy_(w),
}


@pytest.mark.parametrize("name", sorted(INPLACE) + ["masked_fill_", "setitem"])
def test_recorded_inplace_on_non_leaf_matches_torch(name):
    (x, tx), (w, tw) = pair(), pair(seed=3)
    results = []
    for a, b, lib in ((x, w, "ours"), (tx, tw, "torch")):
        y = a * 1.5 + 0.25
        before = y * 3  # made before the write: its gradient must skip the in-place op
        if name == "masked_fill_":
            mask = np.arange(12).reshape(3, 4) % 3 == 0
            y.masked_fill_(Tensor(mask) if lib == "ours" else torch.tensor(mask), 0.0)
        elif name == "setitem":
            y[1] = b[0] * 2
        else:
            INPLACE[name](y, b)
        loss = ((y * y).sum() + (before * 3).sum() + (y * b).sum())
        loss.backward()
        results.append((y.detach().numpy().copy(), np.asarray(a.grad), np.asarray(b.grad)))
    for ours, theirs in zip(results[0], results[1]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


def test_recorded_inplace_on_a_leaf_without_grad_with_an_argument_that_requires_grad():
    (w, tw) = pair((3,))
    for weight, zeros in ((w, Tensor(np.zeros((2, 3)))), (tw, torch.zeros(2, 3, dtype=torch.float64))):
        zeros.add_(weight)
        zeros[1] = weight * 3
        (zeros * zeros).sum().backward()
    np.testing.assert_allclose(w.grad, tw.grad.numpy(), rtol=1e-12)


def test_chained_inplace_ops_and_consumers_between_them_match_torch():
    x, tx = pair()
    grads = []
    for t in (x, tx):
        y = t.exp() * 1.0
        first = y * 2
        y.mul_(3)
        second = y.tanh()
        y.add_(t)
        (first.sum() + (second * second).sum() + (y * y).sum()).backward()
        grads.append(np.asarray(t.grad))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-12)


def test_inplace_on_a_non_leaf_with_views_raises_instead_of_a_wrong_gradient():
    x, _ = pair()
    y = x * 2
    y.view(12)
    with pytest.raises(RuntimeError, match="shares its storage with a view"):
        y.add_(1)
