"""``autocast`` with bfloat16, against torch's CPU autocast: the default dtypes per device, a
training step of Linear + GELU + LayerNorm + cross-entropy (loss, dtypes, float32 gradients and
updated weights from the same first weights), and GradScaler beside bfloat16.

Tolerances: the step's matmuls and activations round to bfloat16 (8 significant bits, a
relative step of up to 2^-7), and either side may round a value the other way; the loss and
gradients are float32 sums of such values, so they agree to about 1e-2 relative.
"""
import warnings

import numpy as np
import pytest

import neural_arch
from neural_arch import amp, optim

ml_dtypes = pytest.importorskip("ml_dtypes")

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(11)
X = RNG.standard_normal((8, 6)).astype(np.float32)
TARGET = RNG.integers(0, 4, 8)
SIZES = (6, 16, 4)


def _weights():
    rng = np.random.default_rng(5)
    first = (rng.standard_normal((SIZES[1], SIZES[0])) / np.sqrt(SIZES[0]),
             rng.standard_normal(SIZES[1]) * 0.1)
    norm = (1.0 + 0.1 * rng.standard_normal(SIZES[1]), 0.1 * rng.standard_normal(SIZES[1]))
    last = (rng.standard_normal((SIZES[2], SIZES[1])) / np.sqrt(SIZES[1]),
            rng.standard_normal(SIZES[2]) * 0.1)
    return [w.astype(np.float32) for pair in (first, norm, last) for w in pair]


def _model(lib):
    layers = [lib.nn.Linear(SIZES[0], SIZES[1]), lib.nn.GELU(), lib.nn.LayerNorm(SIZES[1]),
              lib.nn.Linear(SIZES[1], SIZES[2])]
    params = [p for layer in (layers[0], layers[2], layers[3])
              for p in (layer.weight, layer.bias)]
    for param, value in zip(params, _weights()):
        if lib is neural_arch:
            param.array[...] = value
        else:
            with lib.no_grad():
                param.copy_(lib.tensor(value))
    return lib.nn.Sequential(*layers), params


def _step(lib, optimizer_class, autocast):
    model, params = _model(lib)
    optimizer = optimizer_class(params, lr=0.1)
    x, target = lib.tensor(X), lib.tensor(TARGET)
    with autocast("cpu", dtype=lib.bfloat16):
        hidden = model[2](model[1](model[0](x)))
        logits = model[3](hidden)
        loss = lib.nn.functional.cross_entropy(logits, target)
    dtypes = [str(t.dtype).replace("torch.", "") for t in (hidden, logits, loss)]
    loss.backward()
    grads = [np.asarray(p.grad if lib is neural_arch else p.grad.numpy()) for p in params]
    optimizer.step()
    with autocast("cpu", dtype=lib.bfloat16):
        after = lib.nn.functional.cross_entropy(model(x), target)
    values = [np.asarray(p.array if lib is neural_arch else p.detach().numpy()) for p in params]
    return float(loss.item()), float(after.item()), dtypes, grads, values


def test_linear_gelu_layer_norm_cross_entropy_step_matches_torch_autocast_bfloat16():
    torch = pytest.importorskip("torch")
    got = _step(neural_arch, optim.SGD, amp.autocast)
    want = _step(torch, torch.optim.SGD, torch.autocast)
    assert got[2] == want[2] == ["bfloat16", "bfloat16", "float32"]
    np.testing.assert_allclose(got[:2], want[:2], rtol=1e-2)
    for ours, theirs in zip(got[3], want[3]):
        assert ours.dtype == np.float32  # float32 parameters get float32 gradients
        np.testing.assert_allclose(ours, theirs, rtol=3e-2, atol=3e-3)
    for ours, theirs in zip(got[4], want[4]):
        np.testing.assert_allclose(ours, theirs, rtol=1e-2, atol=1e-3)


def test_default_dtypes_are_torchs_bfloat16_on_cpu_float16_on_cuda():
    torch = pytest.importorskip("torch")
    assert amp.autocast("cpu").fast_dtype == neural_arch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA the region disables itself
        assert amp.autocast("cuda").fast_dtype == np.float16
    assert str(torch.get_autocast_dtype("cpu")) == "torch.bfloat16"
    with amp.autocast("cpu"):
        assert amp.get_autocast_dtype("cpu") == neural_arch.bfloat16
        x = neural_arch.tensor(X)
        assert (x @ x.T).dtype == neural_arch.bfloat16
    assert amp.get_autocast_dtype("cpu") == neural_arch.bfloat16  # torch's default outside too


def test_cuda_region_asking_for_bfloat16_warns_and_disables_itself():
    with pytest.warns(UserWarning, match="Disabling autocast"):
        region = amp.autocast("cuda", dtype=neural_arch.bfloat16)
    with region:
        assert not amp.is_autocast_enabled("cuda")


def test_gradscaler_beside_bfloat16_unscales_and_steps_as_torchs():
    torch = pytest.importorskip("torch")
    results = []
    for lib, scaler_class, optimizer_class in (
            (neural_arch, amp.GradScaler, optim.SGD),
            (torch, torch.amp.GradScaler, torch.optim.SGD)):
        weight = lib.tensor(X[:4].copy(), requires_grad=True)
        low = lib.tensor(X[4:].copy(), dtype=lib.bfloat16, requires_grad=True)
        scaler = scaler_class("cpu", init_scale=1024.0)
        optimizer = optimizer_class([weight, low], lr=0.5)
        with (amp.autocast if lib is neural_arch else torch.autocast)("cpu"):
            loss = ((weight @ low.T) ** 2).float().mean()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        results.append([np.asarray(t.detach().float().numpy() if lib is torch else
                                   t.array.astype(np.float32)) for t in (weight, low)]
                       + [scaler.get_scale()])
    ours, theirs = results
    assert ours[2] == theirs[2] == 1024.0  # finite gradients: no backoff, no skipped step
    for got, want in zip(ours[:2], theirs[:2]):
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2)
