"""``Module.to`` in torch's forms and the casts ``half`` / ``float`` / ``double`` / ``bfloat16`` /
``type`` / ``cpu``, against torch on the same model: the dtype of every parameter, buffer and
gradient after each call, parameters that keep their identity, and a training step after the
casts that equals torch's."""
import subprocess
import sys

import numpy as np
import pytest

import neural_arch as na
from neural_arch import optim

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(3)
X = RNG.standard_normal((5, 4)).astype(np.float32)
TARGET = RNG.standard_normal((5, 3)).astype(np.float32)


def _build(lib):
    """Linear, BatchNorm1d (float running statistics and an int64 ``num_batches_tracked``),
    ReLU, Linear."""
    return lib.nn.Sequential(lib.nn.Linear(4, 6), lib.nn.BatchNorm1d(6), lib.nn.ReLU(),
                             lib.nn.Linear(6, 3))


def _pair():
    ours, theirs = _build(na), _build(torch)
    theirs.load_state_dict({k: torch.tensor(np.array(v.array)) for k, v in
                            ours.state_dict().items()})
    return ours, theirs


def _name(dtype):
    return str(dtype).replace("torch.", "")


def _dtypes(module):
    """{name: dtype name} of every parameter, gradient and buffer."""
    table = {}
    for name, param in module.named_parameters():
        table[name] = _name(param.dtype)
        if param.grad is not None:
            table[name + ".grad"] = _name(param.grad.dtype)
    for name, buf in module.named_buffers():
        table[name] = _name(buf.dtype)
    return table


def _step(model, lib, x, target):
    """One forward and backward in training mode; returns the output."""
    out = model(x)
    ((out - target) ** 2).mean().backward()
    return out


def _ours_step(model, dtype=np.float32):
    return _step(model, na, na.tensor(X, dtype=dtype), na.tensor(TARGET, dtype=dtype))


def _torch_step(model, dtype=torch.float32):
    return _step(model, torch, torch.tensor(X, dtype=dtype), torch.tensor(TARGET, dtype=dtype))


def _assert_same_values(ours, theirs, rtol, grad_tolerance=None):
    """Parameters and buffers to ``rtol``; gradients to ``grad_tolerance`` (default: rtol)."""
    grad_tolerance = rtol if grad_tolerance is None else grad_tolerance
    for (name, p), (_, q) in zip(ours.named_parameters(), theirs.named_parameters()):
        np.testing.assert_allclose(np.asarray(p.array, np.float64), q.detach().double().numpy(),
                                   rtol=rtol, atol=rtol, err_msg=name)
        np.testing.assert_allclose(np.asarray(p.grad if not hasattr(p.grad, "array")
                                              else p.grad.array, np.float64),
                                   q.grad.double().numpy(), rtol=grad_tolerance,
                                   atol=grad_tolerance, err_msg=name + ".grad")
    for (name, b), (_, c) in zip(ours.named_buffers(), theirs.named_buffers()):
        np.testing.assert_allclose(np.asarray(b.array, np.float64), c.double().numpy(),
                                   rtol=rtol, atol=rtol, err_msg=name)


CALLS = [
    ("to(float64)", lambda lib, m: m.to(lib.float64)),
    ("to(dtype=float16)", lambda lib, m: m.to(dtype=lib.float16)),
    ("to('cpu', float32)", lambda lib, m: m.to("cpu", lib.float32)),
    ("to(device, dtype, non_blocking)", lambda lib, m: m.to(lib.device("cpu"), lib.float64, True)),
    ("to(float16 tensor)", lambda lib, m: m.to(lib.zeros(1, dtype=lib.float16))),
    ("to(device=, dtype=, non_blocking=)", lambda lib, m: m.to(device="cpu", dtype=lib.float32,
                                                    non_blocking=False)),
    ("to(dtype, non_blocking)", lambda lib, m: m.to(lib.float64, False)),
    ("to('cpu')", lambda lib, m: m.to("cpu")),
    ("to()", lambda lib, m: m.to()),
    ("half()", lambda lib, m: m.half()),
    ("float()", lambda lib, m: m.float()),
    ("double()", lambda lib, m: m.double()),
    ("cpu()", lambda lib, m: m.cpu()),
    ("type(float32)", lambda lib, m: m.type(lib.float32)),
    ("type(float64)", lambda lib, m: m.type(lib.float64)),
]


def test_every_form_casts_what_torch_casts_and_keeps_the_parameters():
    ours, theirs = _pair()
    _ours_step(ours)
    _torch_step(theirs)  # gradients exist, so their casts are checked too
    ids = [id(p) for p in ours.parameters()]
    for label, call in CALLS:
        assert call(na, ours) is ours, label
        call(torch, theirs)
        assert _dtypes(ours) == _dtypes(theirs), label
        assert [id(p) for p in ours.parameters()] == ids, label
        assert all(p.grad is not None for p in ours.parameters()), label
    # torch's type() casts integer buffers too: num_batches_tracked is float64 by now
    assert _dtypes(ours)["1.num_batches_tracked"] == "float64"


def test_float64_and_back_trains_as_torch():
    ours, theirs = _pair()
    for model in (ours, theirs):
        model.double()
    np.testing.assert_allclose(np.asarray(_ours_step(ours, np.float64).array),
                               _torch_step(theirs, torch.float64).detach().numpy(), rtol=1e-12)
    _assert_same_values(ours, theirs, rtol=1e-12)
    for model in (ours, theirs):
        model.float()
        model.zero_grad()
    assert _dtypes(ours) == _dtypes(theirs)
    np.testing.assert_allclose(np.asarray(_ours_step(ours).array),
                               _torch_step(theirs).detach().numpy(), rtol=1e-5, atol=1e-6)
    _assert_same_values(ours, theirs, rtol=1e-5)


def test_an_optimizer_built_before_the_cast_steps_the_cast_parameters():
    ours, theirs = _pair()
    ours_opt = optim.SGD(ours.parameters(), lr=0.1, momentum=0.9)
    theirs_opt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9)
    ours.to(dtype=na.float64)
    theirs.to(dtype=torch.float64)
    for _ in range(2):
        ours_opt.zero_grad()
        theirs_opt.zero_grad()
        _ours_step(ours, np.float64)
        _torch_step(theirs, torch.float64)
        ours_opt.step()
        theirs_opt.step()
    assert all(p.dtype == np.float64 for p in ours.parameters())
    _assert_same_values(ours, theirs, rtol=1e-10)


def test_bfloat16_casts_floating_state_only():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    ours, theirs = _pair()
    _ours_step(ours)
    _torch_step(theirs)
    ours.bfloat16()
    theirs.bfloat16()
    assert _dtypes(ours) == _dtypes(theirs)
    assert ours[0].weight.dtype == ml_dtypes.bfloat16
    ours.to(na.float32)
    theirs.to(torch.float32)
    assert _dtypes(ours) == _dtypes(theirs)
    # the same weights rounded to nearest even and widened again: equal; the gradients of the
    # float32 step differ in their last bits (the first bias's are rounding noise near 0)
    _assert_same_values(ours, theirs, rtol=0, grad_tolerance=1e-6)


@pytest.mark.parametrize("label, call, error, words", [
    ("integer dtype", lambda m: m.to(na.int64), TypeError, "floating point"),
    ("integer tensor", lambda m: m.to(na.zeros(1, dtype=na.int64)), TypeError, "int64"),
    ("too many arguments", lambda m: m.to("cpu", na.float32, False, 1), TypeError, r"to\(\)"),
    ("unknown keyword", lambda m: m.to(foo=1), TypeError, "foo"),
    ("device twice", lambda m: m.to("cpu", device="cpu"), TypeError, "device"),
    ("dtype twice", lambda m: m.to(na.float64, dtype=na.float64), TypeError, "dtype"),
    ("non_blocking not a bool", lambda m: m.to(na.float64, "yes"), TypeError, "non_blocking"),
    ("unknown device", lambda m: m.to("tpu"), ValueError, "tpu"),
    ("type to int with parameters", lambda m: m.type(na.int64), RuntimeError, "floating"),
])
def test_bad_arguments_raise_and_change_nothing(label, call, error, words):
    ours, _ = _pair()
    before = _dtypes(ours)
    with pytest.raises(error, match=words):
        call(ours)
    assert _dtypes(ours) == before, label


def test_torch_refuses_the_same_calls():
    model = _build(torch)
    with pytest.raises(TypeError, match="floating point"):
        model.to(torch.int64)
    with pytest.raises(TypeError):
        model.to(torch.zeros(1, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="floating"):
        model.type(torch.int64)


def test_cuda_moves_or_says_why_not():
    model = _build(na)
    try:
        assert model.cuda() is model
    except RuntimeError as exc:  # no GPU here: the backend names what is missing
        assert "cuda" in str(exc).lower()
        assert all(p.device == "cpu" for p in model.parameters())
        return
    assert all(p.device == "cuda" for p in model.parameters())
    assert model.cpu() is model and all(p.device == "cpu" for p in model.parameters())


def test_bfloat16_without_ml_dtypes_names_the_extra():
    script = (
        "import sys; sys.modules['ml_dtypes'] = None\n"
        "from neural_arch import nn\n"
        "model = nn.Linear(2, 2)\n"
        "try:\n"
        "    model.bfloat16()\n"
        "except TypeError as exc:\n"
        "    print('raised:', exc)\n"
        "print(model.weight.dtype)\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                            timeout=50)
    assert result.returncode == 0, result.stderr
    assert "neural-arch[bfloat16]" in result.stdout and "float32" in result.stdout, result.stdout
