"""MLP and GPT: structure, numerics against NumPy, gradients, training and generation."""
import math

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch import nn
from neural_arch.core import manual_seed
from neural_arch.models import GPT, MLP, GPTConfig
from neural_arch.optim import SGD, AdamW
from nn_gradients import check_parameter_gradients

pytestmark = pytest.mark.timeout(120)


def test_mlp_structure_and_forward():
    model = MLP([5, 7, 6, 3])
    kinds = [type(m).__name__ for m in model]
    assert kinds == ["Linear", "ReLU", "Linear", "ReLU", "Linear"]
    assert [n for n, _ in model.named_parameters()][:2] == ["0.weight", "0.bias"]
    x = np.random.default_rng(0).standard_normal((4, 5)).astype(np.float32)
    h = x
    for i, layer in enumerate(m for m in model if isinstance(m, nn.Linear)):
        h = h @ layer.weight.array.T + layer.bias.array
        if i < 2:
            h = np.maximum(h, 0)
    np.testing.assert_allclose(model(x).array, h, rtol=1e-5, atol=1e-6)
    with_dropout = MLP([4, 8, 2], activation="gelu", dropout=0.1)
    assert [type(m).__name__ for m in with_dropout] == ["Linear", "GELU", "Dropout", "Linear"]
    with pytest.raises(ValueError, match="swish"):
        MLP([2, 2], activation="swish")
    with pytest.raises(ValueError, match=r"\[3\]"):
        MLP([3])


def test_mlp_training_matches_torch():
    torch = pytest.importorskip("torch")
    manual_seed(0)
    ours = MLP([6, 8, 3])
    theirs = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with torch.no_grad():
        for t, o in zip((theirs[0], theirs[2]), (ours[0], ours[2])):
            t.weight.copy_(torch.from_numpy(o.weight.array))
            t.bias.copy_(torch.from_numpy(o.bias.array))
    opt = SGD(ours.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9, nesterov=True,
                           weight_decay=1e-3)
    rng = np.random.default_rng(1)
    for _ in range(5):
        x = rng.standard_normal((10, 6)).astype(np.float32)
        y = rng.integers(0, 3, 10)
        loss = F.cross_entropy(ours(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tloss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        assert loss.item() == pytest.approx(tloss.item(), rel=1e-5)
    np.testing.assert_allclose(ours[2].weight.array, theirs[2].weight.detach().numpy(),
                               rtol=1e-4, atol=1e-6)


def _tiny_config(**overrides):
    values = dict(block_size=8, vocab_size=11, n_layer=2, n_head=2, n_embd=8)
    values.update(overrides)
    return GPTConfig(**values)


def _float64(model):
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def test_gpt_shapes_loss_and_tying():
    manual_seed(0)
    model = GPT(_tiny_config())
    assert model.lm_head.weight is model.wte.weight
    names = [n for n, _ in model.named_parameters()]
    assert "lm_head.weight" not in names and "wte.weight" in names
    assert {"lm_head.weight", "wte.weight"} <= set(model.state_dict())
    idx = np.random.default_rng(0).integers(0, 11, (3, 8))
    targets = np.roll(idx, -1, axis=1)
    logits, loss = model(idx, targets)
    assert logits.shape == (3, 8, 11) and model(idx)[1] is None
    z = logits.array.reshape(-1, 11).astype(np.float64)
    z = z - z.max(1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(1, keepdims=True))
    expected = -logp[np.arange(24), targets.reshape(-1)].mean()
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert loss.item() == pytest.approx(math.log(11), rel=0.1)  # small init: near uniform
    masked = targets.copy()
    masked[:, :4] = -1
    keep = masked.reshape(-1) != -1
    assert model(idx, masked)[1].item() == pytest.approx(
        -logp[np.arange(24)[keep], masked.reshape(-1)[keep]].mean(), rel=1e-5)
    with pytest.raises(ValueError, match="block_size 8"):
        model(np.zeros((1, 9), dtype=np.int64))


def test_gpt_is_causal():
    manual_seed(1)
    model = GPT(_tiny_config())
    idx = np.random.default_rng(1).integers(0, 11, (2, 8))
    changed = idx.copy()
    changed[:, 5:] = (changed[:, 5:] + 1) % 11
    a, b = model(idx)[0].array, model(changed)[0].array
    np.testing.assert_allclose(a[:, :5], b[:, :5], rtol=1e-6, atol=1e-7)
    assert not np.allclose(a[:, 5:], b[:, 5:])


def test_gpt_loss_gradients_match_finite_differences():
    manual_seed(2)
    model = _float64(GPT(_tiny_config(n_embd=8, vocab_size=7, block_size=6)))
    rng = np.random.default_rng(2)
    idx = rng.integers(0, 7, (2, 6))
    targets = rng.integers(0, 7, (2, 6))
    names = ["wte.weight", "wpe.weight", "h.0.attn.c_attn.weight", "h.1.ln_1.weight",
             "h.1.mlp.c_fc.bias", "ln_f.bias"]
    check_parameter_gradients(model, lambda m: m(idx, targets)[1], names=names, max_entries=6,
                              rtol=1e-5, atol=1e-9)


def test_gpt_learns_a_sequence_and_state_dict_round_trip(tmp_path):
    manual_seed(3)
    config = _tiny_config(n_embd=16, block_size=8)
    model = GPT(config)
    idx = np.array([[1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1]])
    targets = np.roll(idx, -1, axis=1)
    optimizer = AdamW(model.parameters(), lr=1e-2, weight_decay=0.0)
    first = None
    for _ in range(60):
        _, loss = model(idx, targets)
        first = loss.item() if first is None else first
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    assert loss.item() < 0.2 * first
    path = tmp_path / "gpt.safetensors"
    model.save(path)
    restored = GPT(config)
    restored.load(path)
    assert restored.lm_head.weight is restored.wte.weight
    np.testing.assert_array_equal(restored(idx)[0].array, model(idx)[0].array)


def test_gpt_generate():
    manual_seed(4)
    model = GPT(_tiny_config(block_size=4))
    start = np.array([[1, 2], [3, 4]])
    out = model.generate(start, max_new_tokens=7, rng=np.random.default_rng(0))
    assert out.shape == (2, 9) and out.dtype == np.int64
    np.testing.assert_array_equal(out[:, :2], start)
    assert out.min() >= 0 and out.max() < 11
    again = model.generate(start, max_new_tokens=7, rng=np.random.default_rng(0))
    np.testing.assert_array_equal(out, again)
    greedy = model.generate(start, max_new_tokens=3, top_k=1)
    tokens = start.copy()
    for _ in range(3):
        logits, _ = model(tokens[:, -4:])
        tokens = np.concatenate([tokens, logits.array[:, -1].argmax(-1)[:, None]], axis=1)
    np.testing.assert_array_equal(greedy, tokens)
    assert model.training
    with pytest.raises(ValueError, match="temperature"):
        model.generate(start, 1, temperature=0.0)
