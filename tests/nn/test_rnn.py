"""nn.RNN / nn.LSTM / nn.GRU against torch from the same weights: outputs, final states and the
gradients of the input, every parameter and the initial states; finite differences too."""
import math
import warnings

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core import Tensor, gradcheck, manual_seed
from nn_gradients import check_parameter_gradients

pytestmark = pytest.mark.timeout(60)

SEQ, BATCH, IN, HID = 4, 3, 5, 6
MODES = {  # name: (our class, torch class name, extra constructor arguments)
    "lstm": (nn.LSTM, "LSTM", {}),
    "gru": (nn.GRU, "GRU", {}),
    "rnn_tanh": (nn.RNN, "RNN", {"nonlinearity": "tanh"}),
    "rnn_relu": (nn.RNN, "RNN", {"nonlinearity": "relu"}),
}


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _randn(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape)


def build_pair(torch, mode, dtype="float64", **kwargs):
    """Our module and torch's, with our (seeded) weights copied into torch's by name."""
    ours_cls, torch_name, extra = MODES[mode]
    manual_seed(0)
    ours = ours_cls(IN, HID, dtype=dtype, **extra, **kwargs)
    theirs = getattr(torch.nn, torch_name)(IN, HID, dtype=getattr(torch, dtype), **extra,
                                           **kwargs)
    result = theirs.load_state_dict({k: torch.from_numpy(v.array.copy())
                                     for k, v in ours.named_parameters()})
    assert not result.missing_keys and not result.unexpected_keys
    return ours, theirs


def run_both(torch, ours, theirs, x, hx, seed=1):
    """Forward both with a fixed weighted-sum loss; returns ((ours), (torch's)) where each is
    (output, states, input grad, state grads, parameter grads)."""
    rng = np.random.default_rng(seed)
    results = []
    for module, tensor in ((ours, lambda a: Tensor(a, requires_grad=True)),
                           (theirs, lambda a: torch.tensor(a, requires_grad=True))):
        x_t = tensor(x)
        hx_t = None if hx is None else (tuple(tensor(h) for h in hx) if isinstance(hx, tuple)
                                        else tensor(hx))
        out, states = module(x_t, hx_t)
        states = states if isinstance(states, tuple) else (states,)
        results.append((out, states, x_t, hx_t))
    rng_weights = [rng.standard_normal(t.shape) for t in (results[0][0],) + results[0][1]]
    packed = []
    for i, (out, states, x_t, hx_t) in enumerate(results):
        loss = 0
        for value, weight in zip((out,) + states, rng_weights):
            loss = loss + (value * (weight if i == 0 else torch.from_numpy(weight))).sum()
        loss.backward()
        hx_list = () if hx_t is None else (hx_t if isinstance(hx_t, tuple) else (hx_t,))
        as_np = (lambda t: t.array) if i == 0 else (lambda t: t.detach().numpy())
        grad_np = (lambda t: t.grad) if i == 0 else (lambda t: t.grad.numpy())
        packed.append((as_np(out), [as_np(s) for s in states], grad_np(x_t),
                       [grad_np(h) for h in hx_list],
                       {n: grad_np(p) for n, p in (ours if i == 0 else theirs).named_parameters()}))
    return packed


def assert_match(ours, theirs, rtol=1e-10, atol=1e-12):
    out, states, gx, ghx, gparams = ours
    t_out, t_states, t_gx, t_ghx, t_gparams = theirs
    np.testing.assert_allclose(out, t_out, rtol=rtol, atol=atol, err_msg="output")
    assert len(states) == len(t_states)
    for k, (s, ts) in enumerate(zip(states, t_states)):
        assert s.shape == ts.shape
        np.testing.assert_allclose(s, ts, rtol=rtol, atol=atol, err_msg=f"state {k}")
    np.testing.assert_allclose(gx, t_gx, rtol=rtol, atol=atol, err_msg="input grad")
    for k, (g, tg) in enumerate(zip(ghx, t_ghx)):
        np.testing.assert_allclose(g, tg, rtol=rtol, atol=atol, err_msg=f"initial state {k}")
    assert gparams.keys() == t_gparams.keys()
    for name in gparams:
        np.testing.assert_allclose(gparams[name], t_gparams[name], rtol=rtol, atol=atol,
                                   err_msg=name)


def initial_states(mode, layers, directions, batch=(BATCH,), seed=3):
    shape = (layers * directions,) + batch + (HID,)
    if mode == "lstm":
        return _randn(*shape, seed=seed), _randn(*shape, seed=seed + 1)
    return _randn(*shape, seed=seed)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("num_layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
@pytest.mark.parametrize("bidirectional", [False, True])
@pytest.mark.parametrize("given_hx", [False, True])
def test_matches_torch_values_and_gradients(torch, mode, num_layers, batch_first, bidirectional,
                                            given_hx):
    ours, theirs = build_pair(torch, mode, num_layers=num_layers, batch_first=batch_first,
                              bidirectional=bidirectional)
    x = _randn(*((BATCH, SEQ, IN) if batch_first else (SEQ, BATCH, IN)), seed=2)
    hx = initial_states(mode, num_layers, 2 if bidirectional else 1) if given_hx else None
    got, want = run_both(torch, ours, theirs, x, hx)
    directions = 2 if bidirectional else 1
    assert got[0].shape == want[0].shape
    assert got[1][0].shape == (num_layers * directions, BATCH, HID)
    assert_match(got, want)


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("given_hx", [False, True])
def test_unbatched_input_matches_torch(torch, mode, given_hx):
    # batch_first does not apply to unbatched (seq, features) input
    ours, theirs = build_pair(torch, mode, num_layers=2, bidirectional=True, batch_first=True)
    hx = initial_states(mode, 2, 2, batch=()) if given_hx else None
    got, want = run_both(torch, ours, theirs, _randn(SEQ, IN, seed=4), hx)
    assert got[0].shape == (SEQ, 2 * HID) and got[1][0].shape == (4, HID)
    assert_match(got, want)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_float32_and_no_bias_match_torch(torch, mode):
    ours, theirs = build_pair(torch, mode, dtype="float32", num_layers=2, bias=False)
    assert ours.weight_ih_l0.dtype == np.float32
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    x = _randn(SEQ, BATCH, IN, seed=5).astype(np.float32)
    hx = initial_states(mode, 2, 1)
    hx = tuple(h.astype(np.float32) for h in hx) if mode == "lstm" else hx.astype(np.float32)
    got, want = run_both(torch, ours, theirs, x, hx)
    assert got[0].dtype == np.float32 and got[2].dtype == np.float32
    assert_match(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("mode", ["lstm", "gru"])
def test_dropout_between_layers(torch, mode):
    ours, theirs = build_pair(torch, mode, num_layers=2, dropout=0.5)
    x = _randn(SEQ, BATCH, IN, seed=6)
    ours.eval()
    theirs.eval()
    assert_match(*run_both(torch, ours, theirs, x, None))  # eval: no dropout at all

    def final_hidden(module):
        _, states = module(Tensor(x))
        return (states[0] if mode == "lstm" else states).array

    eval_output, eval_hidden = ours(Tensor(x))[0].array, final_hidden(ours)
    ours.train()
    train_output, train_hidden = ours(Tensor(x))[0].array, final_hidden(ours)
    assert np.abs(train_output - eval_output).max() > 1e-3  # training does drop
    np.testing.assert_allclose(train_hidden[0], eval_hidden[0])  # never in the first layer
    # p = 1 drops the whole first-layer output: the second layer sees zeros, and its own output
    # (the module's output) is not dropped
    ours.dropout = 1.0
    out, _ = ours(Tensor(x))
    second_layer = MODES[mode][0](HID, HID, dtype="float64")
    second_layer.load_state_dict({k.replace("_l1", "_l0"): v.array
                                  for k, v in ours.named_parameters() if k.endswith("_l1")})
    expected, _ = second_layer(Tensor(np.zeros((SEQ, BATCH, HID))))
    assert np.abs(out.array).max() > 0
    np.testing.assert_allclose(out.array, expected.array, rtol=1e-12, atol=1e-14)


def test_state_dict_names_shapes_and_init_match_torch(torch):
    manual_seed(1)
    ours = nn.LSTM(IN, 40, num_layers=2, bidirectional=True)
    theirs = torch.nn.LSTM(IN, 40, num_layers=2, bidirectional=True)
    want = {k: tuple(v.shape) for k, v in theirs.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in ours.state_dict().items()} == want
    assert list(dict(ours.named_parameters())) == list(dict(theirs.named_parameters()))
    bound = 1 / math.sqrt(40)
    values = np.concatenate([p.array.ravel() for p in ours.parameters()])
    assert values.dtype == np.float32 and np.abs(values).max() <= bound
    assert values.std() == pytest.approx(bound / math.sqrt(3), rel=0.05)
    assert len(ours.all_weights) == 4 and len(ours.all_weights[0]) == 4
    assert repr(ours) == repr(theirs)


def test_refusals_and_shape_errors():
    with pytest.raises(NotImplementedError, match="proj_size=3"):
        nn.LSTM(IN, HID, proj_size=3)
    with pytest.raises(ValueError, match="dropout"):
        nn.GRU(IN, HID, dropout=1.5)
    with pytest.raises(ValueError, match="nonlinearity"):
        nn.RNN(IN, HID, nonlinearity="sigmoid")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        nn.LSTM(IN, HID, dropout=0.2)
    assert any("num_layers greater than 1" in str(w.message) for w in caught)
    lstm = nn.LSTM(IN, HID, num_layers=2)
    x = np.zeros((SEQ, BATCH, IN), np.float32)
    with pytest.raises(ValueError, match="Expected 5, got 4"):
        lstm(np.zeros((SEQ, BATCH, 4), np.float32))
    with pytest.raises(ValueError, match=r"\(2, 3, 6\), got \(1, 3, 6\)"):
        lstm(x, (np.zeros((1, BATCH, HID), np.float32), np.zeros((2, BATCH, HID), np.float32)))
    with pytest.raises(TypeError, match="tuple"):
        lstm(x, np.zeros((2, BATCH, HID), np.float32))
    with pytest.raises(ValueError, match="2-D but got 3-D"):
        nn.GRU(IN, HID)(x[:, 0], np.zeros((1, BATCH, HID), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        lstm(x.astype(np.float64))


@pytest.mark.parametrize("mode", list(MODES))
def test_gradients_against_finite_differences(mode):
    cls, _, extra = MODES[mode]
    manual_seed(2)
    module = cls(3, HID, num_layers=2, bidirectional=True, dtype="float64", **extra)
    x = _randn(3, 2, 3, seed=7)
    check_parameter_gradients(module, lambda m: m(x)[0], max_entries=4)
    hx = initial_states(mode, 2, 2, batch=(2,))
    hx_tensors = [Tensor(h + 0, requires_grad=True) for h in (hx if mode == "lstm" else (hx,))]

    def outputs(x_t, *states):
        out, final = module(x_t, tuple(states) if mode == "lstm" else states[0])
        final = final if isinstance(final, tuple) else (final,)
        return [out] + list(final)

    def loss(*args):
        total = None
        for value in outputs(*args):
            total = (value * value).sum() if total is None else total + (value * value).sum()
        return total

    assert gradcheck(loss, [Tensor(x, requires_grad=True)] + hx_tensors)
