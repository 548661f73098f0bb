"""Layers against NumPy formulas, and their gradients against finite differences (float64)."""
import math

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core import Tensor, gradcheck, manual_seed
from nn_gradients import check_parameter_gradients

pytestmark = pytest.mark.timeout(120)

F64 = np.float64


def _randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def test_linear_forward_init_and_gradients():
    manual_seed(0)
    layer = nn.Linear(300, 200)
    assert layer.weight.shape == (200, 300) and layer.bias.shape == (200,)
    assert layer.weight.dtype == np.float32
    bound = 1 / math.sqrt(300)
    assert np.abs(layer.weight.array).max() <= bound and np.abs(layer.bias.array).max() <= bound
    # U(-b, b) has standard deviation b / sqrt(3).
    assert layer.weight.array.std() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    x = _randn(4, 300).astype(np.float32)
    np.testing.assert_allclose(layer(x).array, x @ layer.weight.array.T + layer.bias.array,
                               rtol=1e-5, atol=1e-6)
    assert nn.Linear(3, 2, bias=False).bias is None

    small = nn.Linear(4, 3, dtype=F64)
    xs = _randn(5, 4, seed=1)
    check_parameter_gradients(small, lambda m: m(xs))
    assert gradcheck(lambda t: small(t), [Tensor(_randn(2, 3, 4, seed=2), requires_grad=True)])


def test_init_formulas_match_torch():
    torch = pytest.importorskip("torch")
    for shape in [(3, 5), (7, 2, 3), (4, 6, 2, 2)]:
        assert nn.init.calculate_fan_in_and_fan_out(np.empty(shape)) == \
            torch.nn.init._calculate_fan_in_and_fan_out(torch.empty(shape))
    for name, param in [("relu", None), ("tanh", None), ("leaky_relu", math.sqrt(5)),
                        ("leaky_relu", None), ("sigmoid", None), ("selu", None)]:
        assert nn.init.calculate_gain(name, param) == pytest.approx(
            torch.nn.init.calculate_gain(name, param))
    # Linear's default weight range: torch's kaiming_uniform_(a=sqrt(5)) bound for fan_in 64.
    theirs = torch.nn.init.kaiming_uniform_(torch.empty(2000, 64), a=math.sqrt(5))
    ours = nn.Linear(64, 2000).weight.array
    assert abs(theirs).max().item() == pytest.approx(np.abs(ours).max(), rel=1e-3)


def _gelu_exact(x):
    return 0.5 * x * (1 + np.vectorize(math.erf)(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))


@pytest.mark.parametrize("layer,reference", [
    (nn.ReLU(), lambda x: np.maximum(x, 0)),
    (nn.GELU(), _gelu_exact),
    (nn.GELU(approximate="tanh"), _gelu_tanh),
    (nn.Tanh(), np.tanh),
    (nn.Sigmoid(), lambda x: 1 / (1 + np.exp(-x))),
    (nn.Softmax(dim=-1), lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True)),
])
def test_activations(layer, reference):
    x = _randn(3, 5) + 0.05  # keep away from ReLU's kink at 0
    np.testing.assert_allclose(layer(Tensor(x)).array, reference(x), rtol=1e-7, atol=1e-10)
    assert gradcheck(lambda t: layer(t), [Tensor(x, requires_grad=True)])
    with pytest.raises(ValueError, match="'fast'"):
        nn.GELU(approximate="fast")


def test_dropout_train_and_eval():
    manual_seed(0)
    layer = nn.Dropout(0.25)
    x = np.ones((200, 200), dtype=np.float32)
    out = layer(x).array
    zero_fraction = np.mean(out == 0)
    assert zero_fraction == pytest.approx(0.25, abs=0.01)
    np.testing.assert_allclose(out[out != 0], 1 / 0.75, rtol=1e-6)
    layer.eval()
    np.testing.assert_array_equal(layer(Tensor(x)).array, x)
    assert nn.Dropout(0.0)(Tensor(x)).array is x
    with pytest.raises(ValueError, match="1.5"):
        nn.Dropout(1.5)
    # Gradient flows through the kept entries only, scaled like the forward pass.
    layer.train()
    t = Tensor(np.ones((50, 50)), requires_grad=True)
    kept = layer(t)
    kept.sum().backward()
    np.testing.assert_allclose(t.grad, kept.array, rtol=1e-12)


def test_layer_norm_formula_and_gradients():
    layer = nn.LayerNorm(6, dtype=F64)
    layer.weight.array[...] = _randn(6, seed=3)
    layer.bias.array[...] = _randn(6, seed=4)
    x = _randn(2, 3, 6, seed=5) * 3 + 1
    mean = x.mean(-1, keepdims=True)
    var = x.var(-1, keepdims=True)
    expected = (x - mean) / np.sqrt(var + 1e-5) * layer.weight.array + layer.bias.array
    np.testing.assert_allclose(layer(x).array, expected, rtol=1e-10, atol=1e-12)
    check_parameter_gradients(layer, lambda m: m(x))
    assert gradcheck(lambda t: layer(t), [Tensor(x, requires_grad=True)])
    plain = nn.LayerNorm((3, 6), elementwise_affine=False)
    assert plain.weight is None and list(plain.parameters()) == []
    flat = x.reshape(2, 18)
    ref = (flat - flat.mean(1, keepdims=True)) / np.sqrt(flat.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(plain(x).array, ref.reshape(x.shape), rtol=1e-10)


def test_embedding_lookup_and_repeated_index_gradient():
    manual_seed(1)
    big = nn.Embedding(1000, 64)
    assert big.weight.array.mean() == pytest.approx(0, abs=0.02)
    assert big.weight.array.std() == pytest.approx(1, rel=0.02)
    layer = nn.Embedding(5, 3, dtype=F64)
    idx = np.array([[1, 3, 1], [1, 0, 4]])
    out = layer(idx)
    np.testing.assert_array_equal(out.array, layer.weight.array[idx])
    upstream = _randn(2, 3, 3, seed=6)
    (out * upstream).sum().backward()
    expected = np.zeros((5, 3))
    np.add.at(expected, idx.reshape(-1), upstream.reshape(-1, 3))
    np.testing.assert_allclose(layer.weight.grad, expected, rtol=1e-12)
    assert not layer.weight.grad[2].any()
    check_parameter_gradients(layer, lambda m: m(idx))


def _numpy_causal_attention(x, module, heads):
    w_attn, b_attn = module.c_attn.weight.array, module.c_attn.bias.array
    w_proj, b_proj = module.c_proj.weight.array, module.c_proj.bias.array
    batch, time, embed = x.shape
    d = embed // heads
    q, k, v = np.split(x @ w_attn.T + b_attn, 3, axis=-1)
    split = lambda t: t.reshape(batch, time, heads, d).transpose(0, 2, 1, 3)  # noqa: E731
    q, k, v = split(q), split(k), split(v)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    scores = np.where(np.triu(np.ones((time, time), bool), 1), -np.inf, scores)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    y = (weights @ v).transpose(0, 2, 1, 3).reshape(batch, time, embed)
    return y @ w_proj.T + b_proj


def test_causal_self_attention_formula_causality_and_gradients():
    manual_seed(2)
    attn = nn.CausalSelfAttention(8, 2, dtype=F64)
    x = _randn(2, 5, 8, seed=7)
    out = attn(x)
    np.testing.assert_allclose(out.array, _numpy_causal_attention(x, attn, 2), rtol=1e-10,
                               atol=1e-12)
    changed = x.copy()
    changed[:, 3:] += 10.0
    np.testing.assert_allclose(attn(changed).array[:, :3], out.array[:, :3], rtol=1e-12)
    assert not np.allclose(attn(changed).array[:, 3:], out.array[:, 3:])
    check_parameter_gradients(attn, lambda m: m(x), max_entries=10)
    assert gradcheck(lambda t: attn(t), [Tensor(x[:1, :4], requires_grad=True)])
    with pytest.raises(ValueError, match=r"embed_dim \(8\).*num_heads \(3\)"):
        nn.CausalSelfAttention(8, 3)


def test_causal_self_attention_dropout_only_in_training():
    manual_seed(3)
    attn = nn.CausalSelfAttention(8, 2, dropout=0.5)
    x = _randn(1, 4, 8, seed=8).astype(np.float32)
    attn.eval()
    np.testing.assert_allclose(attn(x).array, attn(x).array)
    eval_out = attn(x).array
    attn.train()
    assert not np.allclose(attn(x).array, eval_out)


def test_multihead_attention_against_numpy_and_gradients():
    manual_seed(4)
    mha = nn.MultiheadAttention(6, 3, batch_first=True, dtype=F64)
    mha.in_proj_bias.array[...] = _randn(18, seed=9)
    q, kv = _randn(2, 4, 6, seed=10), _randn(2, 5, 6, seed=11)
    pad = np.zeros((2, 5), bool)
    pad[1, 3:] = True
    out, weights = mha(q, kv, kv, key_padding_mask=pad)
    w, b = mha.in_proj_weight.array, mha.in_proj_bias.array
    proj = lambda t, i: (t @ w[6 * i:6 * i + 6].T + b[6 * i:6 * i + 6]).reshape(  # noqa: E731
        t.shape[0], t.shape[1], 3, 2).transpose(0, 2, 1, 3)
    scores = proj(q, 0) @ proj(kv, 1).transpose(0, 1, 3, 2) / math.sqrt(2)
    scores = np.where(pad[:, None, None, :], -np.inf, scores)
    attn = np.exp(scores - scores.max(-1, keepdims=True))
    attn /= attn.sum(-1, keepdims=True)
    y = (attn @ proj(kv, 2)).transpose(0, 2, 1, 3).reshape(2, 4, 6)
    expected = y @ mha.out_proj.weight.array.T + mha.out_proj.bias.array
    np.testing.assert_allclose(out.array, expected, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights.array, attn.mean(1), rtol=1e-10, atol=1e-12)
    assert np.all(weights.array[1, :, 3:] == 0)
    check_parameter_gradients(mha, lambda m: m(q, kv, kv, need_weights=False)[0], max_entries=8)


def test_multihead_attention_matches_torch():
    torch = pytest.importorskip("torch")
    manual_seed(5)
    ours = nn.MultiheadAttention(8, 2, dtype=F64)
    theirs = torch.nn.MultiheadAttention(8, 2, dtype=torch.float64)
    with torch.no_grad():
        theirs.in_proj_weight.copy_(torch.from_numpy(ours.in_proj_weight.array))
        theirs.in_proj_bias.copy_(torch.from_numpy(_randn(24, seed=12)))
        theirs.out_proj.weight.copy_(torch.from_numpy(ours.out_proj.weight.array))
        theirs.out_proj.bias.copy_(torch.from_numpy(_randn(8, seed=13)))
    ours.in_proj_bias.array[...] = _randn(24, seed=12)
    ours.out_proj.bias.array[...] = _randn(8, seed=13)
    x = _randn(5, 3, 8, seed=14)  # (L, N, E): batch_first=False as in PyTorch
    causal = np.triu(np.ones((5, 5), bool), 1)
    for kwargs in (dict(), dict(attn_mask=causal), dict(average_attn_weights=False)):
        tkwargs = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v
                   for k, v in kwargs.items()}
        t = torch.from_numpy(x)
        expected_out, expected_weights = theirs(t, t, t, **tkwargs)
        out, weights = ours(x, x, x, **kwargs)
        np.testing.assert_allclose(out.array, expected_out.detach().numpy(), rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(weights.array, expected_weights.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
    out_causal, _ = ours(x, x, x, is_causal=True)
    out_mask, _ = ours(x, x, x, attn_mask=causal)
    np.testing.assert_allclose(out_causal.array, out_mask.array)


def test_containers():
    layers = [nn.Linear(2, 3), nn.ReLU(), nn.Linear(3, 1)]
    seq = nn.Sequential(*layers)
    assert len(seq) == 3 and seq[0] is layers[0] and seq[-1] is layers[2]
    assert list(seq) == layers
    assert isinstance(seq[1:], nn.Sequential) and list(seq[1:]) == layers[1:]
    with pytest.raises(IndexError, match="3"):
        seq[3]
    x = _randn(4, 2).astype(np.float32)
    manual = layers[2](layers[1](layers[0](x)))
    np.testing.assert_array_equal(seq(x).array, manual.array)
    mlist = nn.ModuleList([nn.Linear(1, 1)]).append(nn.Linear(1, 2))
    mlist.extend([nn.Tanh()])
    assert len(mlist) == 3 and [n for n, _ in mlist.named_parameters()] == \
        ["0.weight", "0.bias", "1.weight", "1.bias"]
    mlist[2] = nn.Sigmoid()
    assert isinstance(mlist[2], nn.Sigmoid)
    with pytest.raises(TypeError, match="int"):
        nn.ModuleList([3])


def test_flatten_and_identity():
    x = _randn(2, 3, 4)
    assert nn.Flatten()(x).shape == (2, 12)
    assert nn.Flatten(0, 1)(Tensor(x)).shape == (6, 4)
    t = Tensor(x)
    assert nn.Identity(5, anything=1)(t) is t


def _log_softmax(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def test_cross_entropy_loss_module():
    logits = _randn(6, 4, seed=15)
    target = np.array([0, 3, -100, 2, 1, 3])
    logp = _log_softmax(logits)
    keep = target != -100
    nll = -logp[np.arange(6)[keep], target[keep]]
    assert nn.CrossEntropyLoss()(Tensor(logits), target).item() == pytest.approx(nll.mean())
    assert nn.CrossEntropyLoss(reduction="sum")(Tensor(logits), target).item() == \
        pytest.approx(nll.sum())
    eps = 0.1
    smooth = -(1 - eps) * logp[np.arange(6)[keep], target[keep]] - eps * logp[keep].mean(-1)
    assert nn.CrossEntropyLoss(label_smoothing=eps)(Tensor(logits), target).item() == \
        pytest.approx(smooth.mean())
    loss_fn = nn.CrossEntropyLoss(ignore_index=3)
    assert gradcheck(lambda z: loss_fn(z, target.clip(0)), [Tensor(logits, requires_grad=True)])
    with pytest.raises(ValueError, match="'avg'"):
        nn.CrossEntropyLoss(reduction="avg")


def test_mse_loss_module():
    a, b = _randn(3, 2, seed=16), _randn(3, 2, seed=17)
    assert nn.MSELoss()(Tensor(a), b).item() == pytest.approx(np.mean((a - b) ** 2))
    assert nn.MSELoss("sum")(Tensor(a), b).item() == pytest.approx(np.sum((a - b) ** 2))
    assert gradcheck(lambda t: nn.MSELoss()(t, b), [Tensor(a, requires_grad=True)])
