"""bfloat16 tensors against torch's CPU: the dtype names, casts, each op's result dtype and
values, float32 accumulation in sums and matmul, and gradients.

Tolerances: both sides round each op's result to bfloat16 (8 significant bits, a relative step
of 2^-8 to 2^-7), and may round a value on either side of a tie or of a last float32 bit, so
single ops agree to one bfloat16 step (rtol 1e-2); a chain of ops to a few steps.
"""
import subprocess
import sys

import numpy as np
import pytest

import neural_arch as na
from neural_arch.core.dtypes import is_floating, resolve_dtype
from neural_arch.nn import functional as F

ml_dtypes = pytest.importorskip("ml_dtypes")
torch = pytest.importorskip("torch")
TF = torch.nn.functional

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(7)
X = RNG.standard_normal((4, 8)).astype(np.float32)
Y = RNG.standard_normal((4, 8)).astype(np.float32)
W = RNG.standard_normal((6, 8)).astype(np.float32)
BIAS = RNG.standard_normal(6).astype(np.float32)
TARGET = np.array([0, 5, 2, 1])
ONE_STEP = dict(rtol=1e-2, atol=1e-2)


def ours(array, requires_grad=False):
    return na.tensor(array, dtype=na.bfloat16, requires_grad=requires_grad)


def theirs(array, requires_grad=False):
    return torch.tensor(array).bfloat16().requires_grad_(requires_grad)


def as_float(value):
    array = value.detach().float().numpy() if isinstance(value, torch.Tensor) else value.array
    return np.asarray(array, dtype=np.float64)


def test_names_resolve_to_ml_dtypes_bfloat16():
    from neural_arch.core import torch_dtypes
    assert na.bfloat16 is ml_dtypes.bfloat16 and torch_dtypes.bfloat16 is ml_dtypes.bfloat16
    assert resolve_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    assert is_floating(na.bfloat16) and not is_floating(np.int64)
    t = na.zeros(3, dtype=na.bfloat16)
    assert t.dtype == na.bfloat16 and str(t.dtype) == "bfloat16"
    assert na.tensor([1.5, 2.0], dtype=na.bfloat16, requires_grad=True).requires_grad


def test_casts_round_like_torch_and_carry_gradients():
    x = na.tensor(X * 3.3, requires_grad=True)
    tx = torch.tensor(X * 3.3, requires_grad=True)
    down, tdown = x.to(na.bfloat16), tx.to(torch.bfloat16)
    assert down.dtype == na.bfloat16 and x.bfloat16().dtype == na.bfloat16
    np.testing.assert_array_equal(as_float(down), as_float(tdown))  # round to nearest even
    up, tup = down.float(), tdown.float()
    assert up.dtype == np.float32
    (up * up).sum().backward()
    (tup * tup).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-6)


ELEMENTWISE = [
    ("add", lambda a, b: a + b), ("sub", lambda a, b: a - b), ("mul", lambda a, b: a * b),
    ("div", lambda a, b: a / (b * b + 1.0)), ("mul python float", lambda a, b: a * 0.3),
    ("rsub python float", lambda a, b: 1.5 - a), ("add python int", lambda a, b: a + 2),
    ("pow 2", lambda a, b: a ** 2), ("pow 0.5", lambda a, b: (a * a + 0.1) ** 0.5),
    ("exp", lambda a, b: a.exp()), ("tanh", lambda a, b: a.tanh()),
    ("sigmoid", lambda a, b: a.sigmoid()), ("relu", lambda a, b: a.relu()),
    ("clamp", lambda a, b: a.clamp(-0.5, 0.5)), ("abs", lambda a, b: a.abs()),
]


@pytest.mark.parametrize("name,op", ELEMENTWISE, ids=[name for name, _ in ELEMENTWISE])
def test_elementwise_dtype_values_and_gradients(name, op):
    a, b = ours(X, True), ours(Y, True)
    ta, tb = theirs(X, True), theirs(Y, True)
    out, expected = op(a, b), op(ta, tb)
    assert out.dtype == na.bfloat16, (name, out.dtype)
    np.testing.assert_allclose(as_float(out), as_float(expected), **ONE_STEP)
    out.sum().backward()
    expected.sum().backward()
    for got, want in ((a, ta), (b, tb)):
        if want.grad is not None:
            assert got.grad is not None and got.grad.dtype == na.bfloat16
            np.testing.assert_allclose(got.grad.array.astype(np.float64), as_float(want.grad),
                                       **ONE_STEP)


@pytest.mark.parametrize("other,expected", [(np.float32, np.float32), (np.float16, np.float32),
                                            (np.int64, "bfloat16"), (np.float64, np.float64)])
def test_mixed_dtypes_promote_as_torch(other, expected):
    got = ours(X) + na.tensor(X.astype(other) if other != np.int64 else np.ones((4, 8), other))
    want = theirs(X) + torch.tensor(X.astype(other) if other != np.int64
                                    else np.ones((4, 8), other))
    assert str(got.dtype) == str(want.dtype).replace("torch.", "") == np.dtype(expected).name


def test_sums_accumulate_in_float32_as_torch():
    values = (RNG.random(5000) + 0.5).astype(np.float32)  # bfloat16 partial sums stall at 512
    for reduce in ("sum", "mean"):
        got, want = getattr(ours(values), reduce)(), getattr(theirs(values), reduce)()
        assert got.dtype == na.bfloat16
        np.testing.assert_allclose(as_float(got), as_float(want), rtol=1e-2)
    rows = RNG.standard_normal((3, 2000)).astype(np.float32) + 1.0
    np.testing.assert_allclose(as_float(ours(rows).var(1)), as_float(theirs(rows).var(1)),
                               rtol=2e-2)


def test_matmul_and_linear_compute_in_float32_and_round_once():
    big = RNG.standard_normal((16, 300)).astype(np.float32)
    got, want = ours(big) @ ours(big).T, theirs(big) @ theirs(big).T
    assert got.dtype == na.bfloat16
    np.testing.assert_allclose(as_float(got), as_float(want), rtol=1e-2, atol=0.5)
    x, w, b = ours(X, True), ours(W, True), ours(BIAS, True)
    tx, tw, tb = theirs(X, True), theirs(W, True), theirs(BIAS, True)
    out, expected = F.linear(x, w, b), TF.linear(tx, tw, tb)
    assert out.dtype == na.bfloat16
    np.testing.assert_allclose(as_float(out), as_float(expected), **ONE_STEP)
    (out * out).sum().backward()
    (expected * expected).sum().backward()
    for got_t, want_t in ((x, tx), (w, tw), (b, tb)):
        assert got_t.grad.dtype == na.bfloat16
        np.testing.assert_allclose(got_t.grad.array.astype(np.float64), as_float(want_t.grad),
                                   rtol=3e-2, atol=0.1)
    np.testing.assert_allclose(as_float(na.einsum("ij,kj->ik", ours(X), ours(W))),
                               as_float(torch.einsum("ij,kj->ik", theirs(X), theirs(W))),
                               **ONE_STEP)


LAYERS = [
    ("gelu", lambda lib, f, t: f.gelu(t(X))),
    ("gelu tanh", lambda lib, f, t: f.gelu(t(X), approximate="tanh")),
    ("softmax", lambda lib, f, t: f.softmax(t(X), dim=-1)),
    ("log_softmax", lambda lib, f, t: f.log_softmax(t(X), dim=-1)),
    ("layer_norm", lambda lib, f, t: f.layer_norm(t(X), (8,), t(W[0]), t(W[1]))),
    ("cross_entropy", lambda lib, f, t: f.cross_entropy(t(X), lib.tensor(TARGET))),
    ("mse_loss", lambda lib, f, t: f.mse_loss(t(X), t(Y))),
]


@pytest.mark.parametrize("name,op", LAYERS, ids=[name for name, _ in LAYERS])
def test_layers_and_losses_in_bfloat16_match_torch(name, op):
    made = {"ours": [], "torch": []}

    def tensor_maker(side, make):
        def tensor(array):
            made[side].append(make(array, True))
            return made[side][-1]
        return tensor

    got = op(na, F, tensor_maker("ours", ours))
    want = op(torch, TF, tensor_maker("torch", theirs))
    assert got.dtype == na.bfloat16, (name, got.dtype)
    np.testing.assert_allclose(as_float(got), as_float(want), rtol=2e-2, atol=2e-2)
    weights = RNG.standard_normal(got.shape).astype(np.float32)
    (got * ours(weights)).sum().backward()
    (want * theirs(weights)).sum().backward()
    for got_t, want_t in zip(made["ours"], made["torch"]):
        assert got_t.grad.dtype == na.bfloat16
        np.testing.assert_allclose(got_t.grad.array.astype(np.float64), as_float(want_t.grad),
                                   rtol=3e-2, atol=3e-2)


def test_without_ml_dtypes_the_name_exists_and_using_it_names_the_extra():
    script = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "import neural_arch as torch\n"
        "table = {'float32': torch.float32, 'bfloat16': torch.bfloat16}\n"
        "try:\n"
        "    torch.zeros(2, dtype=torch.bfloat16)\n"
        "except TypeError as exc:\n"
        "    print('raised:', exc)\n"
        "for cast in (lambda t: t.to(torch.bfloat16), lambda t: t.bfloat16()):\n"
        "    try:\n"
        "        cast(torch.tensor([1.0]))\n"
        "    except TypeError as exc:\n"
        "        print('raised:', exc)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=50)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 3 and all("neural-arch[bfloat16]" in line for line in lines), lines
