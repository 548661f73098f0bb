"""nn.LSTMCell / nn.GRUCell / nn.RNNCell against torch, and a tiny LSTM language model trained
with SGD tracking torch's losses step by step from the same weights."""
import numpy as np
import pytest

from neural_arch import nn, optim
from neural_arch import functional as F
from neural_arch.core import Tensor, manual_seed

pytestmark = pytest.mark.timeout(60)

BATCH, IN, HID = 3, 5, 6
CELLS = {  # name: (our class, torch class name, extra constructor arguments)
    "lstm": (nn.LSTMCell, "LSTMCell", {}),
    "gru": (nn.GRUCell, "GRUCell", {}),
    "rnn_tanh": (nn.RNNCell, "RNNCell", {"nonlinearity": "tanh"}),
    "rnn_relu": (nn.RNNCell, "RNNCell", {"nonlinearity": "relu"}),
}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def copy_weights(torch, ours, theirs):
    result = theirs.load_state_dict({k: torch.from_numpy(v.array.copy())
                                     for k, v in ours.named_parameters()})
    assert not result.missing_keys and not result.unexpected_keys


@pytest.mark.parametrize("mode", list(CELLS))
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("given_hx", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_cell_matches_torch(torch, mode, batched, given_hx, bias):
    ours_cls, torch_name, extra = CELLS[mode]
    manual_seed(0)
    ours = ours_cls(IN, HID, bias=bias, dtype="float64", **extra)
    theirs = getattr(torch.nn, torch_name)(IN, HID, bias=bias, dtype=torch.float64, **extra)
    copy_weights(torch, ours, theirs)
    batch = (BATCH,) if batched else ()
    x = _randn(*batch, IN, seed=1)
    n_states = 2 if mode == "lstm" else 1
    hx = [_randn(*batch, HID, seed=2 + k) for k in range(n_states)] if given_hx else None
    weights = [_randn(*batch, HID, seed=10 + k) for k in range(n_states)]

    def run(module, tensor, wrap):
        x_t = tensor(x)
        hx_t = None if hx is None else [tensor(h) for h in hx]
        arg = None if hx_t is None else (tuple(hx_t) if mode == "lstm" else hx_t[0])
        out = module(x_t, arg)
        out = out if isinstance(out, tuple) else (out,)
        loss = sum((o * wrap(w)).sum() for o, w in zip(out, weights))
        loss.backward()
        return out, x_t, hx_t or []

    ours_out, ours_x, ours_hx = run(ours, lambda a: Tensor(a, requires_grad=True), lambda w: w)
    t_out, t_x, t_hx = run(theirs, lambda a: torch.tensor(a, requires_grad=True),
                           torch.from_numpy)
    close = dict(rtol=1e-10, atol=1e-12)
    for o, t in zip(ours_out, t_out):
        assert o.shape == tuple(t.shape)
        np.testing.assert_allclose(o.array, t.detach().numpy(), **close)
    np.testing.assert_allclose(ours_x.grad, t_x.grad.numpy(), **close)
    for h, t in zip(ours_hx, t_hx):
        np.testing.assert_allclose(h.grad, t.grad.numpy(), **close)
    for (name, p), (t_name, tp) in zip(ours.named_parameters(), theirs.named_parameters()):
        assert name == t_name
        np.testing.assert_allclose(p.grad, tp.grad.numpy(), err_msg=name, **close)


def test_cell_shape_errors():
    cell = nn.LSTMCell(IN, HID)
    with pytest.raises(ValueError, match=r"\(batch, 5\)"):
        cell(np.zeros((BATCH, 4), np.float32))
    with pytest.raises(ValueError, match=r"expected h of shape \(3, 6\)"):
        cell(np.zeros((BATCH, IN), np.float32),
             (np.zeros((2, HID), np.float32), np.zeros((BATCH, HID), np.float32)))
    with pytest.raises(ValueError, match=r"expected hx of shape \(6,\)"):
        nn.GRUCell(IN, HID)(np.zeros(IN, np.float32), np.zeros((1, HID), np.float32))


class TinyLanguageModel(nn.Module):
    """Embedding -> 2-layer LSTM -> Linear."""

    def __init__(self, vocab, embed, hidden):
        super().__init__()
        self.embed = nn.Embedding(vocab, embed, dtype="float64")
        self.lstm = nn.LSTM(embed, hidden, num_layers=2, dtype="float64")
        self.head = nn.Linear(hidden, vocab, dtype="float64")

    def forward(self, tokens):
        return self.head(self.lstm(self.embed(tokens))[0])


def test_lstm_language_model_sgd_tracks_torch(torch):
    vocab, embed, hidden, seq, batch = 11, 8, 12, 7, 4
    manual_seed(0)
    ours = TinyLanguageModel(vocab, embed, hidden)
    # the same parameter names: embed.weight, lstm.weight_ih_l0, ..., head.bias
    theirs = torch.nn.ModuleDict({
        "embed": torch.nn.Embedding(vocab, embed, dtype=torch.float64),
        "lstm": torch.nn.LSTM(embed, hidden, num_layers=2, dtype=torch.float64),
        "head": torch.nn.Linear(hidden, vocab, dtype=torch.float64)})

    def theirs_forward(tokens):
        return theirs["head"](theirs["lstm"](theirs["embed"](tokens))[0])

    copy_weights(torch, ours, theirs)
    tokens = np.random.default_rng(1).integers(0, vocab, size=(seq + 1, batch))
    inputs, targets = tokens[:-1], tokens[1:].reshape(-1)
    ours_opt = optim.SGD(ours.parameters(), lr=0.5)
    theirs_opt = torch.optim.SGD(theirs.parameters(), lr=0.5)
    ours_losses, theirs_losses = [], []
    for _ in range(5):
        logits = ours(inputs)
        loss = F.cross_entropy(logits.reshape(-1, vocab), targets)
        ours_opt.zero_grad()
        loss.backward()
        ours_opt.step()
        ours_losses.append(loss.item())
        t_logits = theirs_forward(torch.from_numpy(inputs))
        t_loss = torch.nn.functional.cross_entropy(t_logits.reshape(-1, vocab),
                                                   torch.from_numpy(targets))
        theirs_opt.zero_grad()
        t_loss.backward()
        theirs_opt.step()
        theirs_losses.append(t_loss.item())
    np.testing.assert_allclose(ours_losses, theirs_losses, rtol=1e-10)
    assert ours_losses[-1] < ours_losses[0] - 0.05  # it learns
