"""``neural_arch.functional``: values against NumPy formulas, gradients against finite
differences, and the errors for bad shapes and targets."""
import math

import numpy as np
import pytest

import neural_arch as na
import neural_arch.functional as F
from neural_arch import Tensor, gradcheck

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng()  # unseeded: fresh inputs every run


def leaf(*shape, scale=1.0):
    return Tensor(RNG.standard_normal(shape) * scale, requires_grad=True)


def np_log_softmax(x, axis=-1):
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


ERF = np.vectorize(math.erf)


def test_linear_matches_numpy_and_gradients():
    x, w, b = leaf(5, 4), leaf(3, 4), leaf(3)
    np.testing.assert_allclose(F.linear(x, w, b).array, x.array @ w.array.T + b.array)
    assert gradcheck(F.linear, [x, w, b])
    assert gradcheck(F.linear, [x, w])
    assert gradcheck(F.linear, [leaf(2, 3, 4), w, b])
    assert gradcheck(F.linear, [leaf(4), w, b])
    assert gradcheck(lambda w_, b_: F.linear(Tensor(x.array), w_, b_), [w, b])
    with pytest.raises(ValueError, match=r"input shape \(5, 4\) does not match weight shape "
                                         r"\(3, 5\)"):
        F.linear(x, leaf(3, 5))
    with pytest.raises(ValueError, match=r"bias shape \(4,\) does not match weight shape"):
        F.linear(x, w, leaf(4))


@pytest.mark.parametrize("fn,reference", [
    (F.relu, lambda v: np.maximum(v, 0)), (F.tanh, np.tanh),
    (F.sigmoid, lambda v: 1 / (1 + np.exp(-v))), (F.silu, lambda v: v / (1 + np.exp(-v))),
    (F.gelu, lambda v: 0.5 * v * (1 + ERF(v / np.sqrt(2)))),
    (lambda t: F.gelu(t, approximate="tanh"),
     lambda v: 0.5 * v * (1 + np.tanh(np.sqrt(2 / np.pi) * (v + 0.044715 * v ** 3)))),
    (F.erf, ERF),
])
def test_activations(fn, reference):
    x = leaf(4, 6, scale=2.0)
    np.testing.assert_allclose(fn(x).array, reference(x.array), rtol=1e-12, atol=1e-14)
    assert gradcheck(fn, [x])


def test_erf_accuracy_float64_and_float32():
    grid = np.concatenate([np.linspace(-7, 7, 20001), np.geomspace(1e-300, 5, 500),
                           -np.geomspace(1e-300, 5, 500)])
    reference = ERF(grid)
    nonzero = reference != 0
    result = F.erf(Tensor(grid)).array
    assert np.max(np.abs(result[nonzero] / reference[nonzero] - 1)) < 1e-13
    single = F.erf(Tensor(grid.astype(np.float32))).array
    assert single.dtype == np.float32
    finite32 = np.abs(grid) > 1e-37
    assert np.max(np.abs(single[finite32] / ERF(grid.astype(np.float32)[finite32]) - 1)) < 3e-7
    specials = F.erf(Tensor(np.array([0.0, np.inf, -np.inf, np.nan]))).array
    np.testing.assert_array_equal(specials[:3], [0.0, 1.0, -1.0])
    assert np.isnan(specials[3])


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis):
    x = leaf(3, 4, 5, scale=3.0)
    expected = np_log_softmax(x.array, axis)
    np.testing.assert_allclose(F.log_softmax(x, axis).array, expected, rtol=1e-12)
    np.testing.assert_allclose(F.softmax(x, axis).array, np.exp(expected), rtol=1e-12)
    np.testing.assert_array_equal(F.softmax(x, dim=axis).array, F.softmax(x, axis).array)
    np.testing.assert_array_equal(F.log_softmax(x, dim=axis).array, F.log_softmax(x, axis).array)
    assert gradcheck(lambda t: F.softmax(t, axis), [x])
    assert gradcheck(lambda t: F.log_softmax(t, axis), [x])
    big = Tensor(np.array([[1000.0, 0.0, -1000.0]]))
    assert np.all(np.isfinite(F.log_softmax(big).array))


def reference_cross_entropy(logits, target, ignore_index=-100, smoothing=0.0):
    logp = np_log_softmax(logits, axis=1)
    classes = logits.shape[1]
    rows = np.arange(len(target))
    valid = target != ignore_index
    safe = np.where(valid, target, 0)
    nll = -logp[rows, safe]
    per = (1 - smoothing) * nll + smoothing * (-logp.mean(axis=1))
    per = np.where(valid, per, 0.0)
    return per, valid, classes


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_2d(reduction, smoothing):
    logits = leaf(6, 5, scale=2.0)
    target = RNG.integers(0, 5, 6)
    target[1] = -100
    per, valid, _ = reference_cross_entropy(logits.array, target, smoothing=smoothing)
    expected = {"mean": per.sum() / valid.sum(), "sum": per.sum(), "none": per}[reduction]
    out = F.cross_entropy(logits, Tensor(target), reduction=reduction, label_smoothing=smoothing)
    np.testing.assert_allclose(out.array, expected, rtol=1e-12)
    assert gradcheck(lambda t: F.cross_entropy(t, target, reduction=reduction,
                                               label_smoothing=smoothing), [logits])


def test_cross_entropy_gradient_is_softmax_minus_onehot():
    logits = leaf(4, 3)
    target = np.array([0, 2, 1, 2])
    F.cross_entropy(logits, target).backward()
    onehot = np.eye(3)[target]
    np.testing.assert_allclose(logits.grad, (np.exp(np_log_softmax(logits.array)) - onehot) / 4)


def test_cross_entropy_with_spatial_dimensions_and_soft_targets():
    logits = leaf(2, 4, 3)  # (N, C, d1)
    target = RNG.integers(0, 4, (2, 3))
    flat_logits = np.moveaxis(logits.array, 1, -1).reshape(-1, 4)
    per, _, _ = reference_cross_entropy(flat_logits, target.reshape(-1))
    np.testing.assert_allclose(F.cross_entropy(logits, target).array, per.mean(), rtol=1e-12)
    np.testing.assert_allclose(F.cross_entropy(logits, target, reduction="none").array,
                               per.reshape(2, 3), rtol=1e-12)
    assert gradcheck(lambda t: F.cross_entropy(t, target, label_smoothing=0.2), [logits])
    probs = np.exp(np_log_softmax(RNG.standard_normal((5, 3))))
    soft_logits = leaf(5, 3)
    expected = -(probs * np_log_softmax(soft_logits.array)).sum(axis=1).mean()
    np.testing.assert_allclose(F.cross_entropy(soft_logits, probs).array, expected, rtol=1e-12)
    assert gradcheck(lambda t: F.cross_entropy(t, probs, label_smoothing=0.1), [soft_logits])


def test_cross_entropy_errors():
    logits = leaf(4, 3)
    with pytest.raises(ValueError, match=r"target shape \(5,\) does not match input shape "
                                         r"\(4, 3\).*batch sizes 5 vs 4"):
        F.cross_entropy(logits, np.zeros(5, dtype=np.int64))
    with pytest.raises(ValueError, match="target value 3 is out of range for 3 classes"):
        F.cross_entropy(logits, np.array([0, 1, 3, 2]))
    with pytest.raises(ValueError, match="target value -2 is out of range for 3 classes"):
        F.cross_entropy(logits, np.array([0, -2, 1, 2]))
    with pytest.raises(ValueError, match="flatten"):
        F.cross_entropy(leaf(2, 5, 3), np.zeros((2, 5), dtype=np.int64))
    with pytest.raises(ValueError, match="reduction must be one of"):
        F.cross_entropy(logits, np.zeros(4, dtype=np.int64), reduction="avg")


def test_nll_loss():
    logp = Tensor(np_log_softmax(RNG.standard_normal((5, 4))), requires_grad=True)
    target = np.array([1, 0, 3, -100, 3])
    rows = np.array([0, 1, 2, 4])
    np.testing.assert_allclose(F.nll_loss(logp, target).array,
                               -logp.array[rows, target[rows]].mean(), rtol=1e-12)
    assert gradcheck(lambda t: F.nll_loss(t, target, reduction="sum"), [logp])
    with pytest.raises(ValueError, match="target value 4 is out of range for 4 classes"):
        F.nll_loss(logp, np.array([4, 0, 0, 0, 0]))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_regression_losses(reduction):
    x, y = leaf(3, 4), leaf(3, 4)
    reduce = {"mean": np.mean, "sum": np.sum, "none": lambda v: v}[reduction]
    np.testing.assert_allclose(F.mse_loss(x, y, reduction).array, reduce((x.array - y.array) ** 2))
    np.testing.assert_allclose(F.l1_loss(x, y, reduction).array, reduce(np.abs(x.array - y.array)))
    z = y.array
    bce = np.maximum(x.array, 0) - x.array * (z > 0) + np.log1p(np.exp(-np.abs(x.array)))
    np.testing.assert_allclose(
        F.binary_cross_entropy_with_logits(x, (z > 0).astype(float), reduction).array, reduce(bce))
    assert gradcheck(lambda a, b: F.mse_loss(a, b, reduction), [x, y])
    assert gradcheck(lambda a, b: F.l1_loss(a, b, reduction), [x, y])


def test_loss_shape_mismatch_errors():
    with pytest.raises(ValueError, match=r"mse_loss: input shape \(3, 4\) and target shape "
                                         r"\(4, 3\) differ"):
        F.mse_loss(leaf(3, 4), leaf(4, 3))
    with pytest.raises(ValueError, match=r"l1_loss: input shape \(3,\) and target shape \(\)"):
        F.l1_loss(leaf(3), 1.0)


@pytest.mark.parametrize("shape,normalized", [((4, 6), 6), ((2, 3, 4), (3, 4)), ((5, 3), (3,))])
def test_layer_norm(shape, normalized):
    x = leaf(*shape, scale=3.0)
    norm_shape = (normalized,) if isinstance(normalized, int) else normalized
    w, b = leaf(*norm_shape), leaf(*norm_shape)
    axes = tuple(range(x.ndim - len(norm_shape), x.ndim))
    mean = x.array.mean(axis=axes, keepdims=True)
    var = x.array.var(axis=axes, keepdims=True)
    expected = (x.array - mean) / np.sqrt(var + 1e-5) * w.array + b.array
    np.testing.assert_allclose(F.layer_norm(x, normalized, w, b).array, expected, rtol=1e-10)
    assert gradcheck(lambda t, ww, bb: F.layer_norm(t, normalized, ww, bb), [x, w, b])
    assert gradcheck(lambda t: F.layer_norm(t, normalized), [x])
    with pytest.raises(ValueError, match=r"normalized_shape \(7,\) does not match"):
        F.layer_norm(x, 7)


def test_embedding_scatter_adds_repeated_rows():
    weight = leaf(5, 3)
    indices = np.array([[0, 2, 2], [4, 0, 2]])
    np.testing.assert_array_equal(F.embedding(Tensor(indices), weight).array, weight.array[indices])
    assert gradcheck(lambda w: F.embedding(indices, w), [weight])
    weight.grad = None
    F.embedding(indices, weight).sum().backward()
    np.testing.assert_array_equal(weight.grad[:, 0], [2, 0, 3, 0, 1])
    with pytest.raises(ValueError, match="index 5 is out of range for 5 embeddings"):
        F.embedding(np.array([5]), weight)
    with pytest.raises(ValueError, match="indices must be integers"):
        F.embedding(np.array([0.5]), weight)


def test_dropout_is_inverted_and_reproducible():
    x = Tensor(np.ones((200, 50)), requires_grad=True)
    out = F.dropout(x, p=0.3, rng=np.random.default_rng(5))
    kept = out.array != 0
    np.testing.assert_allclose(out.array[kept], 1 / 0.7)
    assert abs(kept.mean() - 0.7) < 0.02
    out.sum().backward()
    np.testing.assert_allclose(x.grad, kept / 0.7)
    again = F.dropout(x, p=0.3, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(again.array, out.array)
    assert F.dropout(x, p=0.3, training=False) is x
    np.testing.assert_array_equal(F.dropout(x, p=1.0).array, 0)
    with pytest.raises(ValueError, match="dropout probability must be in \\[0, 1\\], got 1.5"):
        F.dropout(x, p=1.5)


def reference_attention(q, k, v, allowed):
    scores = q @ np.swapaxes(k, -1, -2) / np.sqrt(q.shape[-1])
    scores = np.where(allowed, scores, -np.inf)
    return np.exp(np_log_softmax(scores)) @ v


def test_scaled_dot_product_attention():
    q, k, v = leaf(2, 4, 3), leaf(2, 4, 3), leaf(2, 4, 5)
    full = np.ones((4, 4), dtype=bool)
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v).array,
                               reference_attention(q.array, k.array, v.array, full), rtol=1e-10)
    causal = np.tril(full)
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, causal=True).array,
                               reference_attention(q.array, k.array, v.array, causal), rtol=1e-10)
    mask = RNG.random((4, 4)) > 0.3
    mask[:, 0] = True
    np.testing.assert_allclose(F.scaled_dot_product_attention(q, k, v, mask=mask).array,
                               reference_attention(q.array, k.array, v.array, mask), rtol=1e-10)
    assert gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, causal=True),
                     [q, k, v])
    assert gradcheck(lambda a, b, c: F.scaled_dot_product_attention(a, b, c, mask=mask),
                     [q, k, v])
    with pytest.raises(ValueError, match="incompatible shapes"):
        F.scaled_dot_product_attention(q, leaf(2, 4, 2), v)


def test_gradcheck_reports_wrong_gradients():
    x = leaf(3)

    def wrong(t):
        out = t * 2
        with na.no_grad():
            extra = t * t  # contributes to the value but not to the gradient
        return out + extra

    with pytest.raises(AssertionError, match=r"gradcheck failed for input 0 at element \(\d,\): "
                                             r"analytic .*, numeric"):
        gradcheck(wrong, [x])
    assert gradcheck(wrong, [x], raise_exception=False) is False
