"""Forward values and gradients against PyTorch (skipped when torch is not installed)."""
import numpy as np
import pytest

import neural_arch as na
import neural_arch.functional as F
from neural_arch import Tensor

torch = pytest.importorskip("torch")
TF = torch.nn.functional

pytestmark = pytest.mark.timeout(120)

RNG = np.random.default_rng()


def pair(*arrays):
    """The same float64 data as neural_arch tensors and as torch tensors, all requiring grad."""
    ours = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    return ours, theirs


def check(our_fn, torch_fn, *arrays, rtol=1e-7, atol=1e-9):
    ours, theirs = pair(*arrays)
    out_ours, out_theirs = our_fn(*ours), torch_fn(*theirs)
    np.testing.assert_allclose(out_ours.array, out_theirs.detach().numpy(), rtol=rtol, atol=atol)
    weights = RNG.standard_normal(out_ours.array.shape)
    (out_ours * weights).sum().backward()
    (out_theirs * torch.tensor(weights)).sum().backward()
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=rtol, atol=atol)


def randn(*shape, scale=1.0):
    return RNG.standard_normal(shape) * scale


def test_linear():
    check(F.linear, TF.linear, randn(6, 4), randn(3, 4), randn(3))
    check(F.linear, TF.linear, randn(2, 5, 4), randn(3, 4), randn(3))


@pytest.mark.parametrize("ours,theirs", [
    (F.relu, TF.relu), (F.tanh, torch.tanh), (F.sigmoid, torch.sigmoid), (F.silu, TF.silu),
    (F.gelu, TF.gelu), (lambda t: F.gelu(t, approximate="tanh"),
                        lambda t: TF.gelu(t, approximate="tanh")),
    (F.erf, torch.erf), (lambda t: F.softmax(t, axis=1), lambda t: TF.softmax(t, dim=1)),
    (lambda t: F.log_softmax(t, axis=-1), lambda t: TF.log_softmax(t, dim=-1)),
])
def test_activations(ours, theirs):
    check(ours, theirs, randn(4, 5, 3, scale=3.0))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
def test_cross_entropy(reduction, smoothing):
    target = RNG.integers(0, 5, 8)
    target[[2, 5]] = -100
    check(lambda t: F.cross_entropy(t, target, reduction=reduction, label_smoothing=smoothing),
          lambda t: TF.cross_entropy(t, torch.tensor(target), reduction=reduction,
                                     label_smoothing=smoothing), randn(8, 5, scale=2.0))
    spatial = RNG.integers(0, 4, (3, 2, 5))
    check(lambda t: F.cross_entropy(t, spatial, reduction=reduction, label_smoothing=smoothing),
          lambda t: TF.cross_entropy(t, torch.tensor(spatial), reduction=reduction,
                                     label_smoothing=smoothing), randn(3, 4, 2, 5))
    probs = np.exp(randn(6, 4))
    probs /= probs.sum(axis=1, keepdims=True)
    check(lambda t: F.cross_entropy(t, probs, reduction=reduction, label_smoothing=smoothing),
          lambda t: TF.cross_entropy(t, torch.tensor(probs), reduction=reduction,
                                     label_smoothing=smoothing), randn(6, 4))


def test_nll_and_regression_losses():
    target = RNG.integers(0, 4, 7)
    target[0] = -100
    check(lambda t: F.nll_loss(F.log_softmax(t), target),
          lambda t: TF.nll_loss(TF.log_softmax(t, -1), torch.tensor(target)), randn(7, 4))
    for reduction in ["mean", "sum", "none"]:
        check(lambda a, b: F.mse_loss(a, b, reduction), lambda a, b: TF.mse_loss(a, b,
              reduction=reduction), randn(3, 4), randn(3, 4))
        check(lambda a, b: F.l1_loss(a, b, reduction), lambda a, b: TF.l1_loss(a, b,
              reduction=reduction), randn(3, 4), randn(3, 4))
        labels = (RNG.random((3, 4)) > 0.5).astype(float)
        check(lambda a: F.binary_cross_entropy_with_logits(a, labels, reduction),
              lambda a: TF.binary_cross_entropy_with_logits(a, torch.tensor(labels),
                                                            reduction=reduction), randn(3, 4))


def test_layer_norm_embedding_attention():
    check(lambda x, w, b: F.layer_norm(x, (3, 4), w, b),
          lambda x, w, b: TF.layer_norm(x, (3, 4), w, b), randn(2, 3, 4, scale=2.0),
          randn(3, 4), randn(3, 4))
    indices = RNG.integers(0, 6, (3, 5))
    check(lambda w: F.embedding(indices, w), lambda w: TF.embedding(torch.tensor(indices), w),
          randn(6, 4))
    mask = RNG.random((5, 5)) > 0.4
    mask[:, 0] = True
    for kwargs_ours, kwargs_torch in [({}, {}), ({"causal": True}, {"is_causal": True}),
                                      ({"mask": mask}, {"attn_mask": torch.tensor(mask)})]:
        check(lambda q, k, v: F.scaled_dot_product_attention(q, k, v, **kwargs_ours),
              lambda q, k, v: TF.scaled_dot_product_attention(q, k, v, **kwargs_torch),
              randn(2, 3, 5, 4), randn(2, 3, 5, 4), randn(2, 3, 5, 6))


def test_tensor_ops_and_composites():
    check(lambda a, b: (a @ b).tanh() * a.sum(axis=1, keepdims=True),
          lambda a, b: (a @ b).tanh() * a.sum(dim=1, keepdim=True), randn(3, 4), randn(4, 2))
    check(lambda a, b: (a / (b.abs() + 1.0)) ** 2 - a.exp().log() + 2.0 ** a,
          lambda a, b: (a / (b.abs() + 1.0)) ** 2 - a.exp().log() + 2.0 ** a,
          randn(3, 4), randn(4))
    check(lambda a: a.max(axis=1) + a.min(axis=0).mean() + a.var(axis=0).sum() + a.std(),
          lambda a: a.amax(dim=1) + a.amin(dim=0).mean() + a.var(dim=0).sum() + a.std(),
          randn(4, 5))
    check(lambda a: a.reshape(2, 6).T[1:, ::2].sqrt().clip(0.5, 1.2),
          lambda a: a.reshape(2, 6).T[1:, ::2].sqrt().clamp(0.5, 1.2), RNG.uniform(0.1, 2, (3, 4)))
    index = np.array([0, 2, 2, 1])
    check(lambda a, b: na.where(a > 0, a, b)[index] + na.stack([a, b])[1, index],
          lambda a, b: torch.where(a > 0, a, b)[index] + torch.stack([a, b])[1, index],
          randn(3, 4), randn(3, 4))
    check(lambda a, b: na.cat([a, b], axis=0).permute(1, 0).unsqueeze(0).sigmoid(),
          lambda a, b: torch.cat([a, b], dim=0).permute(1, 0).unsqueeze(0).sigmoid(),
          randn(2, 3), randn(4, 3))


def test_mlp_training_step_matches_torch():
    x, labels = randn(16, 8), RNG.integers(0, 3, 16)
    weights = [randn(12, 8, scale=0.3), randn(12, scale=0.1), randn(3, 12, scale=0.3),
               randn(3, scale=0.1)]
    ours, theirs = pair(*weights)
    loss_ours = F.cross_entropy(F.linear(F.gelu(F.linear(Tensor(x), *ours[:2])), *ours[2:]),
                                labels)
    loss_theirs = TF.cross_entropy(TF.linear(TF.gelu(TF.linear(torch.tensor(x), *theirs[:2])),
                                             *theirs[2:]), torch.tensor(labels))
    loss_ours.backward()
    loss_theirs.backward()
    np.testing.assert_allclose(loss_ours.item(), loss_theirs.item(), rtol=1e-10)
    for a, b in zip(ours, theirs):
        np.testing.assert_allclose(a.grad, b.grad.numpy(), rtol=1e-8, atol=1e-12)


def test_float32_matches_torch_float32():
    x = RNG.standard_normal((32, 20)).astype(np.float32)
    ours = Tensor(x, requires_grad=True)
    theirs = torch.tensor(x, requires_grad=True)
    out_ours = F.log_softmax(F.gelu(ours) * 2.0, axis=-1).sum()
    out_theirs = TF.log_softmax(TF.gelu(theirs) * 2.0, dim=-1).sum()
    out_ours.backward()
    out_theirs.backward()
    assert ours.grad.dtype == np.float32
    np.testing.assert_allclose(out_ours.item(), out_theirs.item(), rtol=1e-5)
    np.testing.assert_allclose(ours.grad, theirs.grad.numpy(), rtol=1e-4, atol=1e-5)
