"""The same tiny MLP and attention block in Neural Forge and in torch, from the same weights."""
import numpy as np


def mlp_weights(seed: int = 0, sizes=(8, 16, 4)):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((out, inp)).astype(np.float32) / np.sqrt(inp),
             rng.standard_normal(out).astype(np.float32) * 0.1)
            for inp, out in zip(sizes[:-1], sizes[1:])]


def ours_mlp(weights):
    from neural_arch import nn
    layers = []
    for w, b in weights:
        linear = nn.Linear(w.shape[1], w.shape[0])
        linear.weight.array[...] = w
        linear.bias.array[...] = b
        layers += [linear, nn.ReLU()]
    return nn.Sequential(*layers[:-1])


def torch_mlp(torch, weights):
    layers = []
    for w, b in weights:
        linear = torch.nn.Linear(w.shape[1], w.shape[0])
        with torch.no_grad():
            linear.weight.copy_(torch.tensor(w))
            linear.bias.copy_(torch.tensor(b))
        layers += [linear, torch.nn.ReLU()]
    return torch.nn.Sequential(*layers[:-1])


def attention(lib, F, x, wq, wk, wv, wo):
    """One head of self-attention written with each library's own ops: linear, @, softmax."""
    q, k, v = F.linear(x, wq), F.linear(x, wk), F.linear(x, wv)
    scores = (q @ k.transpose(-2, -1)) * float(1.0 / np.sqrt(q.shape[-1]))
    weights = F.softmax(scores, dim=-1)
    return F.linear(weights @ v, wo), {"q": q.dtype, "scores": scores.dtype,
                                       "softmax": weights.dtype}
