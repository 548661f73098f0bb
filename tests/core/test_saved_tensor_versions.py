"""Saved tensors of the convolution, normalisation, pooling, ``pow`` and fused ops are checked
against in-place writes, as torch checks them: each case runs the same program in torch and
here (save by a forward, write into one tensor in place, backward) and both must agree on
whether the backward raises torch's "modified by an inplace operation" error; where neither
raises the gradients must agree too (the ops must not refuse writes torch allows, such as an
in-place ReLU on a batch norm's output)."""
from __future__ import annotations

import re

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch import nn
from neural_arch.core import Tensor, no_grad

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(60)

MODIFIED = "modified by an inplace operation.*is at version 1; expected version 0"


class Ours:
    F = F
    float64 = np.float64
    nn = nn
    no_grad = staticmethod(no_grad)

    @staticmethod
    def leaf(array, grad=True):
        return Tensor(array.copy(), requires_grad=grad)

    @staticmethod
    def softmax_causal(x):
        return F.causal_softmax(x)


class Torch:
    F = torch.nn.functional
    float64 = torch.float64
    nn = torch.nn
    no_grad = staticmethod(torch.no_grad)

    @staticmethod
    def leaf(array, grad=True):
        return torch.tensor(array.copy(), requires_grad=grad)

    @staticmethod
    def softmax_causal(x):
        n = x.shape[-1]
        future = torch.ones(n, n, dtype=torch.bool).triu(1)
        return torch.softmax(x.masked_fill(future, float("-inf")), -1)


def data(*shape, seed=0, positive=False):
    values = np.random.default_rng(seed).standard_normal(shape)
    return np.abs(values) + 0.5 if positive else values


def _conv(spatial, stride=1, padding=1, need=("x", "w")):
    def build(api):
        shape = (2, 3) + (6,) * spatial
        x0, w0 = api.leaf(data(*shape)), api.leaf(data(4, 3, *(3,) * spatial, seed=1))
        b0 = api.leaf(data(4, seed=2))
        x = x0 * 1.0 if "x" in need else x0.detach()
        w = w0 * 1.0 if "w" in need else w0.detach()
        b = b0 * 1.0
        conv = api.F.conv1d if spatial == 1 else api.F.conv2d
        out = conv(x, w, b, stride=stride, padding=padding)
        return out, {"x": x, "w": w, "b": b, "out": out}, (x0, w0, b0)
    return build


def _batch_norm(training, rank=4, affine=True):
    def build(api):
        x0 = api.leaf(data(*((4, 3) + (5,) * (rank - 2))))
        w0, b0 = api.leaf(data(3, seed=1, positive=True)), api.leaf(data(3, seed=2))
        x, w, b = x0 * 1.0, (w0 * 1.0 if affine else None), (b0 * 1.0 if affine else None)
        mean, var = api.leaf(np.zeros(3), False), api.leaf(np.ones(3), False)
        if not training:
            mean, var = api.leaf(data(3, seed=3), False), api.leaf(data(3, seed=4, positive=True),
                                                                  False)
        out = api.F.batch_norm(x, mean, var, w, b, training=training)
        saved = {"x": x, "w": w, "b": b, "running_mean": mean, "running_var": var, "out": out}
        return out, saved, (x0, w0, b0) if affine else (x0,)
    return build


def _batch_norm_module(training):
    def build(api):
        layer = api.nn.BatchNorm2d(3, dtype=api.float64)
        layer.train(training)
        x0 = api.leaf(data(4, 3, 5, 5))
        out = layer(x0 * 1.0)
        saved = {"weight": layer.weight, "running_mean": layer.running_mean, "out": out,
                 "bias": layer.bias}
        return out, saved, (x0, layer.weight, layer.bias)
    return build


def _layer_norm(api):
    x0, w0, b0 = api.leaf(data(4, 5)), api.leaf(data(5, seed=1)), api.leaf(data(5, seed=2))
    x, w, b = x0 * 1.0, w0 * 1.0, b0 * 1.0
    out = api.F.layer_norm(x, (5,), w, b)
    return out, {"x": x, "w": w, "b": b, "out": out}, (x0, w0, b0)


def _pow(form):
    def build(api):
        x0, e0 = api.leaf(data(4, positive=True)), api.leaf(data(4, seed=1, positive=True))
        x, e = x0 * 1.0, e0 * 1.0
        out = {"cube": lambda: x ** 3, "square": lambda: x ** 2, "tensor": lambda: x ** e,
               "tensor_fixed_exponent": lambda: x ** e.detach(), "method": lambda: x.pow(3),
               "scalar_base": lambda: 2 ** x}[form]()
        return out, {"x": x, "e": e, "out": out}, (x0, e0)
    return build


def _cross_entropy(soft):
    def build(api):
        x0 = api.leaf(data(4, 5))
        x = x0 * 1.0
        if soft:
            target = api.leaf(np.full((4, 5), 0.2), False)
        else:
            target = api.leaf(np.array([0, 1, 2, 3]), False)
        out = api.F.cross_entropy(x, target)
        return out, {"logits": x, "target": target}, (x0,)
    return build


def _nll_loss(api):
    x0 = api.leaf(data(4, 5))
    x, target = x0 * 1.0, api.leaf(np.array([0, 1, 2, 3]), False)
    out = api.F.nll_loss(x, target)
    return out, {"input": x, "target": target}, (x0,)


def _embedding(api):
    w0, idx = api.leaf(data(5, 3)), api.leaf(np.array([0, 1, 2, 1]), False)
    w = w0 * 1.0
    out = api.F.embedding(idx, w)
    return out, {"indices": idx, "weight": w, "out": out}, (w0,)


def _unary(name):
    def build(api):
        x0 = api.leaf(data(3, 4))
        x = x0 * 1.0
        out = {"gelu_tanh": lambda: api.F.gelu(x, approximate="tanh"),
               "erf": lambda: (F.erf(x) if api is Ours else torch.erf(x)),
               "causal_softmax": lambda: api.softmax_causal(x[:, :3] * 1.0),
               "max_pool2d": lambda: api.F.max_pool2d(x.reshape(1, 1, 3, 4), 2),
               "avg_pool2d": lambda: api.F.avg_pool2d(x.reshape(1, 1, 3, 4), 2),
               "adaptive_avg_pool2d": lambda: api.F.adaptive_avg_pool2d(
                   x.reshape(1, 1, 3, 4), 1)}[name]()
        return out, {"x": x, "out": out}, (x0,)
    return build


# (case name, build, tensor written into, whether torch raises)
CASES = [
    ("conv2d", _conv(2), "x", True), ("conv2d", _conv(2), "w", True),
    ("conv2d", _conv(2), "b", False), ("conv2d", _conv(2), "out", False),
    ("conv2d_strided", _conv(2, stride=2), "x", True),
    ("conv2d_strided", _conv(2, stride=2), "w", True),
    ("conv2d_wide_padding", _conv(2, padding=3), "x", True),
    ("conv2d_wide_padding", _conv(2, padding=3), "w", True),
    ("conv2d_weight_only", _conv(2, need=("w",)), "x", True),
    ("conv2d_weight_only", _conv(2, need=("w",)), "w", True),
    ("conv2d_input_only", _conv(2, need=("x",)), "w", True),
    ("conv1d", _conv(1), "x", True), ("conv1d", _conv(1), "w", True),
    ("batch_norm_train", _batch_norm(True), "x", True),
    ("batch_norm_train", _batch_norm(True), "w", True),
    ("batch_norm_train", _batch_norm(True), "running_mean", True),
    ("batch_norm_train", _batch_norm(True), "b", False),
    ("batch_norm_train", _batch_norm(True), "out", False),
    ("batch_norm_train_2d", _batch_norm(True, rank=2), "x", True),
    ("batch_norm_train_2d", _batch_norm(True, rank=2), "w", True),
    ("batch_norm_train_no_affine", _batch_norm(True, affine=False), "x", True),
    ("batch_norm_eval", _batch_norm(False), "x", True),
    ("batch_norm_eval", _batch_norm(False), "w", True),
    ("batch_norm_eval", _batch_norm(False), "running_var", True),
    ("batch_norm_eval", _batch_norm(False), "b", False),
    ("BatchNorm2d_train", _batch_norm_module(True), "weight", True),
    ("BatchNorm2d_train", _batch_norm_module(True), "running_mean", True),
    ("BatchNorm2d_train", _batch_norm_module(True), "out", False),
    ("BatchNorm2d_eval", _batch_norm_module(False), "running_mean", True),
    ("BatchNorm2d_eval", _batch_norm_module(False), "bias", False),
    ("layer_norm", _layer_norm, "x", True), ("layer_norm", _layer_norm, "w", True),
    ("layer_norm", _layer_norm, "b", True), ("layer_norm", _layer_norm, "out", False),
    ("pow_cube", _pow("cube"), "x", True), ("pow_cube", _pow("cube"), "out", False),
    ("pow_square", _pow("square"), "x", True), ("pow_method", _pow("method"), "x", True),
    ("pow_tensor", _pow("tensor"), "x", True), ("pow_tensor", _pow("tensor"), "e", True),
    ("pow_tensor", _pow("tensor"), "out", True),
    ("pow_tensor_fixed_exponent", _pow("tensor_fixed_exponent"), "e", True),
    ("pow_scalar_base", _pow("scalar_base"), "x", True),
    ("pow_scalar_base", _pow("scalar_base"), "out", True),
    ("cross_entropy", _cross_entropy(False), "target", True),
    ("cross_entropy", _cross_entropy(False), "logits", False),
    ("cross_entropy_soft", _cross_entropy(True), "target", True),
    ("nll_loss", _nll_loss, "input", True), ("nll_loss", _nll_loss, "target", True),
    ("embedding", _embedding, "indices", True), ("embedding", _embedding, "weight", False),
    ("gelu_tanh", _unary("gelu_tanh"), "x", True), ("erf", _unary("erf"), "x", True),
    ("causal_softmax", _unary("causal_softmax"), "out", True),
    ("max_pool2d", _unary("max_pool2d"), "x", True),
    ("max_pool2d", _unary("max_pool2d"), "out", False),
    ("avg_pool2d", _unary("avg_pool2d"), "x", True),
    ("adaptive_avg_pool2d", _unary("adaptive_avg_pool2d"), "x", False),
]


def _write(api, tensor):
    with api.no_grad():
        if tensor.dtype in (torch.int64, np.int64) or str(tensor.dtype) == "int64":
            tensor.add_(1)  # still in range: targets and indices stay below the class count
        else:
            tensor.mul_(2)


def _run(api, build, written):
    """None when the backward ran (then the leaves' gradients), else the error's text."""
    out, saved, leaves = build(api)
    _write(api, saved[written])
    weights = api.leaf(data(*tuple(out.shape), seed=9), False)
    try:
        (out * weights).sum().backward()
    except RuntimeError as exc:
        return str(exc), None
    return None, [None if leaf.grad is None else
                  np.asarray(leaf.grad.numpy() if api is Torch else leaf.grad) for leaf in leaves]


@pytest.mark.parametrize("name,build,written,raises", CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in CASES])
def test_backward_after_an_inplace_write_matches_torch(name, build, written, raises):
    theirs, their_grads = _run(Torch, build, written)
    assert (theirs is not None) == raises, f"torch: {theirs}"
    ours, our_grads = _run(Ours, build, written)
    if raises:
        assert ours is not None, f"{name}: writing {written} in place did not raise"
        assert re.search(MODIFIED, ours), ours
        return
    assert ours is None, f"{name}: writing {written} raised: {ours}"
    for mine, reference in zip(our_grads, their_grads):
        if reference is None:
            assert mine is None
        else:
            np.testing.assert_allclose(mine, reference, rtol=1e-9, atol=1e-11)


def test_a_layer_run_twice_before_backward_does_not_raise():
    """The running statistics are updated by the layer itself (not a user's write), so a
    second forward before the backward is fine, as in torch."""
    grads = []
    for api in (Ours, Torch):
        layer = api.nn.BatchNorm2d(3, dtype=api.float64)
        x = api.leaf(data(4, 3, 5, 5))
        (layer(x).sum() + (layer(x * 2) ** 2).sum()).backward()
        grads.append(np.asarray(x.grad.numpy() if api is Torch else x.grad))
    np.testing.assert_allclose(grads[0], grads[1], rtol=1e-9, atol=1e-11)
