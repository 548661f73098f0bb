"""BatchNorm1d / BatchNorm2d and Dropout2d against torch: values, gradients, running stats."""
import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch import nn
from neural_arch.core import Tensor, gradcheck, manual_seed

pytestmark = pytest.mark.timeout(60)

SHAPES = [("BatchNorm1d", (6, 4)), ("BatchNorm1d", (5, 4, 7)), ("BatchNorm2d", (3, 4, 5, 6))]


def _pair(torch, name, momentum, affine=True, track=True):
    ours = getattr(nn, name)(4, momentum=momentum, affine=affine, track_running_stats=track,
                             dtype=np.float64)
    theirs = getattr(torch.nn, name)(4, momentum=momentum, affine=affine,
                                     track_running_stats=track, dtype=torch.float64)
    if affine:
        rng = np.random.default_rng(9)
        ours.weight.array[...] = rng.uniform(0.5, 1.5, 4)
        ours.bias.array[...] = rng.standard_normal(4)
        with torch.no_grad():
            theirs.weight.copy_(torch.from_numpy(ours.weight.array))
            theirs.bias.copy_(torch.from_numpy(ours.bias.array))
    return ours, theirs


@pytest.mark.parametrize("name,shape", SHAPES)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_train_steps_then_eval_match_torch(name, shape, momentum):
    torch = pytest.importorskip("torch")
    ours, theirs = _pair(torch, name, momentum)
    rng = np.random.default_rng(0)
    for step in range(3):
        x = rng.standard_normal(shape) * (step + 1) + step
        gout = rng.standard_normal(shape)
        X, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
        ours.zero_grad()
        out, ref = ours(X), theirs(tx)
        out.backward(gout)
        ref.backward(torch.tensor(gout))
        np.testing.assert_allclose(out.array, ref.detach().numpy(), rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(X.grad, tx.grad.numpy(), rtol=1e-9, atol=1e-10)
        np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-9)
        np.testing.assert_allclose(ours.bias.grad, theirs.bias.grad.numpy(), rtol=1e-9)
        theirs.weight.grad = theirs.bias.grad = None
    for key, value in theirs.state_dict().items():
        np.testing.assert_allclose(ours.state_dict()[key], value.numpy(), rtol=1e-12,
                                   err_msg=key)
    assert int(ours.num_batches_tracked.array) == 3
    ours.eval(), theirs.eval()
    ours.zero_grad()
    x = rng.standard_normal(shape)
    X, tx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, ref = ours(X), theirs(tx)
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(out.array, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(X.grad, tx.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(ours.weight.grad, theirs.weight.grad.numpy(), rtol=1e-9)


@pytest.mark.parametrize("affine,track", [(False, True), (True, False), (False, False)])
def test_batchnorm_without_affine_or_running_stats(affine, track):
    torch = pytest.importorskip("torch")
    ours, theirs = _pair(torch, "BatchNorm2d", 0.1, affine, track)
    assert sorted(ours.state_dict()) == sorted(theirs.state_dict())
    x = np.random.default_rng(1).standard_normal((2, 4, 3, 3))
    for mode in (True, False):  # without running stats, eval normalises with the batch's too
        ours.train(mode), theirs.train(mode)
        np.testing.assert_allclose(ours(x).array, theirs(torch.from_numpy(x)).detach().numpy(),
                                   rtol=1e-10, atol=1e-12)


def test_batchnorm_gradcheck_and_functional_form():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    x = Tensor(rng.standard_normal((4, 3, 2)), requires_grad=True)
    w = Tensor(rng.uniform(0.5, 1.5, 3), requires_grad=True)
    b = Tensor(rng.standard_normal(3), requires_grad=True)
    assert gradcheck(lambda a, c, d: F.batch_norm(a, None, None, c, d, training=True),
                     [x, w, b])
    mean, var = Tensor(np.zeros(3)), Tensor(np.ones(3))
    tmean, tvar = torch.zeros(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64)
    F.batch_norm(x, mean, var, w, b, training=True, momentum=0.3)
    torch.nn.functional.batch_norm(torch.from_numpy(x.array), tmean, tvar, training=True,
                                   momentum=0.3)
    np.testing.assert_allclose(mean.array, tmean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(var.array, tvar.numpy(), rtol=1e-12)


def test_batchnorm_statistics_seam_is_used_in_forward_and_backward():
    calls = []

    class Recording(nn.BatchNorm2d):
        def _batch_statistics(self, data, axes):
            calls.append("statistics")
            return super()._batch_statistics(data, axes)

        def _reduce_gradient_sums(self, sums):
            calls.append(("sums", sums.shape))
            return super()._reduce_gradient_sums(sums)

    layer = Recording(3)
    x = Tensor(np.random.default_rng(3).standard_normal((2, 3, 4, 4)).astype(np.float32),
               requires_grad=True)
    layer(x).sum().backward()
    assert calls == ["statistics", ("sums", (2, 3))]


def test_batchnorm_errors():
    with pytest.raises(ValueError, match=r"expected 4D input, got shape \(2, 3, 4\)"):
        nn.BatchNorm2d(3)(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="num_features=3"):
        nn.BatchNorm1d(3)(np.zeros((2, 5), np.float32))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        nn.BatchNorm1d(3)(np.zeros((1, 3), np.float32))


def test_dropout2d_zeroes_whole_channels_with_scale():
    manual_seed(0)
    layer = nn.Dropout2d(0.4)
    x = Tensor(np.random.default_rng(4).uniform(1, 2, (16, 8, 3, 5)), requires_grad=True)
    out = layer(x)
    ratio = np.round(out.array / x.array, 12)
    per_channel = ratio.reshape(16, 8, -1)
    assert np.all(per_channel.max(axis=2) == per_channel.min(axis=2))  # one value per channel
    assert set(np.unique(ratio)) == {0.0, round(1 / 0.6, 12)}
    assert 0.2 < (per_channel[..., 0] == 0).mean() < 0.6
    out.sum().backward()
    np.testing.assert_allclose(x.grad, ratio, rtol=1e-11)
    layer.eval()
    assert layer(x) is x
    assert F.dropout2d(x, 0.5, training=False) is x
    assert np.all(F.dropout2d(x, 1.0).array == 0)
    three_d = F.dropout2d(Tensor(np.ones((4, 6, 7))), 0.5).array
    assert np.all(three_d.max(axis=2) == three_d.min(axis=2))
    with pytest.raises(ValueError, match=r"\(4, 6\)"):
        F.dropout2d(Tensor(np.ones((4, 6))), 0.5)
    with pytest.raises(ValueError, match="inplace"):
        nn.Dropout2d(0.5, inplace=True)
