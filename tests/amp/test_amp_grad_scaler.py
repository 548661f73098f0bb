"""``neural_arch.amp.GradScaler`` against ``torch.amp.GradScaler``: an MLP trained under autocast
with the same weights, skipped steps on inf, growth, and the state dict."""
import math

import numpy as np
import pytest

import neural_arch
from neural_arch import amp, optim
from neural_arch.nn import functional as F

from amp_models import mlp_weights, ours_mlp, torch_mlp

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(2)
BATCHES = [(RNG.standard_normal((6, 8)).astype(np.float32), RNG.integers(0, 4, 6))
           for _ in range(5)]


def _train_ours(weights, scaler, poison_step=None):
    model = ours_mlp(weights)
    opt = optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step, (x, y) in enumerate(BATCHES):
        opt.zero_grad()
        with amp.autocast("cpu", dtype=neural_arch.float16):
            loss = F.cross_entropy(model(neural_arch.tensor(x)), neural_arch.tensor(y))
        scaler.scale(loss).backward()
        if step == poison_step:
            next(iter(model.parameters())).grad[0, 0] = np.inf
        scaler.step(opt)
        scaler.update()
        losses.append(float(loss.array))
    return model, losses


def _train_torch(torch, weights, scaler, poison_step=None):
    model = torch_mlp(torch, weights)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step, (x, y) in enumerate(BATCHES):
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(torch.tensor(x)), torch.tensor(y))
        scaler.scale(loss).backward()
        if step == poison_step:
            with torch.no_grad():
                next(iter(model.parameters())).grad[0, 0] = math.inf
        scaler.step(opt)
        scaler.update()
        losses.append(loss.item())
    return model, losses


def _params(model):
    return [np.asarray(p.array) for p in model.parameters()]


@pytest.mark.parametrize("poison_step", [None, 2])
def test_mlp_training_tracks_torch(poison_step):
    torch = pytest.importorskip("torch")
    weights = mlp_weights()
    ours, ours_losses = _train_ours(weights, amp.GradScaler("cpu", growth_interval=3),
                                    poison_step)
    theirs, their_losses = _train_torch(
        torch, weights, torch.amp.GradScaler("cpu", growth_interval=3), poison_step)
    np.testing.assert_allclose(ours_losses, their_losses, rtol=1e-2, atol=1e-3)
    for mine, their in zip(_params(ours), theirs.parameters()):
        assert mine.dtype == np.float32
        np.testing.assert_allclose(mine, their.detach().numpy(), rtol=1e-2, atol=1e-3)


def test_inf_gradient_skips_the_step_and_halves_the_scale_like_torch():
    torch = pytest.importorskip("torch")
    weights = mlp_weights()
    ours_scaler = amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    their_scaler = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=3)
    ours, _ = _train_ours(weights, ours_scaler, poison_step=4)
    theirs, _ = _train_torch(torch, weights, their_scaler, poison_step=4)
    # steps 0-2 clean: grows once to 2048; step 3 clean; step 4 inf: halves back to 1024
    assert ours_scaler.get_scale() == their_scaler.get_scale() == 1024.0
    assert ours_scaler.state_dict() == their_scaler.state_dict()


def test_skipped_step_leaves_parameters_unchanged():
    model = ours_mlp(mlp_weights())
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.GradScaler("cpu", init_scale=8.0)
    before = [p.copy() for p in _params(model)]
    x, y = BATCHES[0]
    scaler.scale(F.cross_entropy(model(neural_arch.tensor(x)), neural_arch.tensor(y))).backward()
    next(iter(model.parameters())).grad[1, 1] = np.nan
    assert scaler.step(opt) is None
    scaler.update()
    for old, new in zip(before, _params(model)):
        np.testing.assert_array_equal(old, new)
    assert scaler.get_scale() == 4.0


def test_growth_after_growth_interval_clean_steps():
    model = ours_mlp(mlp_weights())
    opt = optim.SGD(model.parameters(), lr=0.01)
    scaler = amp.GradScaler("cpu", init_scale=4.0, growth_interval=2)
    scales = []
    for x, y in BATCHES[:4]:
        opt.zero_grad()
        scaler.scale(F.cross_entropy(model(neural_arch.tensor(x)),
                                     neural_arch.tensor(y))).backward()
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [4.0, 8.0, 8.0, 16.0]


def test_state_dict_round_trip_and_keys_match_torch():
    torch = pytest.importorskip("torch")
    kwargs = dict(init_scale=512.0, growth_factor=3.0, backoff_factor=0.25, growth_interval=7)
    ours = amp.GradScaler("cpu", **kwargs)
    theirs = torch.amp.GradScaler("cpu", **kwargs)
    assert ours.state_dict() == theirs.state_dict()
    ours._growth_tracker = 5
    restored = amp.GradScaler("cpu")
    restored.load_state_dict(ours.state_dict())
    assert restored.state_dict() == ours.state_dict()
    assert amp.GradScaler("cpu", enabled=False).state_dict() == {}
    with pytest.raises(RuntimeError, match="empty"):
        amp.GradScaler("cpu").load_state_dict({})


def test_disabled_scaler_passes_everything_through():
    model = ours_mlp(mlp_weights())
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.GradScaler("cpu", enabled=False)
    x, y = BATCHES[0]
    loss = F.cross_entropy(model(neural_arch.tensor(x)), neural_arch.tensor(y))
    assert scaler.scale(loss) is loss and not scaler.is_enabled()
    assert scaler.get_scale() == 1.0
    loss.backward()
    before = _params(model)[0].copy()
    scaler.step(opt)
    scaler.update()
    assert not np.array_equal(before, _params(model)[0])


def test_misuse_raises_like_torch():
    model = ours_mlp(mlp_weights())
    opt = optim.SGD(model.parameters(), lr=0.1)
    scaler = amp.GradScaler("cpu")
    x, y = BATCHES[0]
    scaler.scale(F.cross_entropy(model(neural_arch.tensor(x)), neural_arch.tensor(y))).backward()
    scaler.unscale_(opt)
    with pytest.raises(RuntimeError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(opt)
    scaler.step(opt)
    with pytest.raises(RuntimeError, match="step\\(\\) has already been called"):
        scaler.step(opt)
    scaler.update()
    half = neural_arch.tensor(np.ones(3, np.float16), requires_grad=True)
    half.grad = np.ones(3, np.float16)
    with pytest.raises(ValueError, match="FP16 gradients"):
        scaler.unscale_(optim.SGD([half], lr=0.1))
    with pytest.raises(ValueError, match="growth_factor.*0.5"):
        amp.GradScaler("cpu", growth_factor=0.5)


def test_cuda_scaler_without_a_gpu_warns_and_disables_itself():
    from neural_arch.backends import get_backend
    if get_backend("cupy").is_available():
        pytest.skip("a GPU is present")
    with pytest.warns(UserWarning, match="CUDA is not available"):
        scaler = amp.GradScaler()
    assert not scaler.is_enabled() and scaler.state_dict() == {}
