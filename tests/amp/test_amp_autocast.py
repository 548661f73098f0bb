"""``neural_arch.amp.autocast``: each op's output dtype and values against torch's CPU autocast
(float16 and bfloat16), gradients reaching float32 parameters as float32, and the state kept
per thread. Without a dtype, autocast("cpu") runs in bfloat16 as torch's does."""
import threading
import warnings

import numpy as np
import pytest

import neural_arch
from neural_arch import amp
from neural_arch.core.bfloat16 import BFLOAT16
from neural_arch.nn import functional as F

from amp_models import attention
from gpu_testing import GPUS

CUDA = GPUS > 0
# torch's CPU default; float16 where ml_dtypes, which bfloat16 needs, is not installed
DEFAULT_CPU_DTYPE = np.dtype(np.float16) if BFLOAT16 is None else BFLOAT16

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(1)
X = RNG.standard_normal((4, 8)).astype(np.float32)
W = RNG.standard_normal((6, 8)).astype(np.float32)
IMG = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)
KERNEL = RNG.standard_normal((3, 2, 3, 3)).astype(np.float32)
TARGET = np.array([0, 5, 2, 1])

# (name, op(lib, functional, tensor) -> output): the same code runs on both libraries
OPS = [
    ("linear", lambda lib, f, t: f.linear(t(X), t(W))),
    ("matmul", lambda lib, f, t: t(X) @ t(W).T),
    ("linear float64 input", lambda lib, f, t: f.linear(t(X.astype(np.float64)),
                                                        t(W.astype(np.float64)))),
    ("conv2d", lambda lib, f, t: f.conv2d(t(IMG), t(KERNEL))),
    ("conv1d", lambda lib, f, t: f.conv1d(t(IMG[:, :, 0]), t(KERNEL[:, :, 0]))),
    ("softmax of linear", lambda lib, f, t: f.softmax(f.linear(t(X), t(W)), dim=-1)),
    ("log_softmax of linear", lambda lib, f, t: f.log_softmax(f.linear(t(X), t(W)), dim=-1)),
    ("cross_entropy", lambda lib, f, t: f.cross_entropy(f.linear(t(X), t(W)), t(TARGET))),
    ("nll_loss", lambda lib, f, t: f.nll_loss(f.log_softmax(f.linear(t(X), t(W)), dim=-1),
                                              t(TARGET))),
    ("mse_loss", lambda lib, f, t: f.mse_loss(f.linear(t(X), t(W)), t(X[:, :6]))),
    ("l1_loss", lambda lib, f, t: f.l1_loss(f.linear(t(X), t(W)), t(X[:, :6]))),
    ("layer_norm", lambda lib, f, t: f.layer_norm(f.linear(t(X), t(W)), (6,),
                                                  t(np.ones(6, np.float32)),
                                                  t(np.zeros(6, np.float32)))),
    ("add float16 + float32", lambda lib, f, t: f.linear(t(X), t(W)) + t(X[:, :6])),
    ("relu of linear", lambda lib, f, t: f.relu(f.linear(t(X), t(W)))),
]


def _run(lib_name, op, dtype="float16"):
    if lib_name == "torch":
        torch = pytest.importorskip("torch")
        with torch.autocast("cpu", dtype=getattr(torch, dtype)):
            return op(torch, torch.nn.functional, torch.tensor)
    with amp.autocast("cpu", dtype=getattr(neural_arch, dtype)):
        return op(neural_arch, F, neural_arch.tensor)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name,op", OPS, ids=[name for name, _ in OPS])
def test_op_dtype_and_value_match_torch_autocast(name, op, dtype):
    if dtype == "bfloat16":
        pytest.importorskip("ml_dtypes")
    expected = _run("torch", op, dtype)
    got = _run("ours", op, dtype)
    assert str(got.dtype) == str(expected.dtype).replace("torch.", ""), name
    np.testing.assert_allclose(np.asarray(got.array, np.float64),
                               expected.detach().double().numpy(), rtol=2e-2, atol=2e-2)


def test_gradients_reach_float32_parameters_as_float32_like_torch():
    torch = pytest.importorskip("torch")
    x, w = neural_arch.tensor(X), neural_arch.tensor(W, requires_grad=True)
    with amp.autocast("cpu", dtype=neural_arch.float16):
        out = F.linear(x, w)
        loss = F.cross_entropy(out, neural_arch.tensor(TARGET))
    loss.backward()
    tw = torch.tensor(W, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.float16):
        tloss = torch.nn.functional.cross_entropy(torch.nn.functional.linear(torch.tensor(X), tw),
                                                  torch.tensor(TARGET))
    tloss.backward()
    assert out.dtype == np.float16 and loss.dtype == np.float32
    assert w.grad.dtype == np.float32
    np.testing.assert_allclose(w.grad, tw.grad.numpy(), rtol=1e-2, atol=1e-3)


def test_attention_block_dtypes_and_output_match_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 8)).astype(np.float32)
    ws = [rng.standard_normal((8, 8)).astype(np.float32) / 3 for _ in range(4)]
    with torch.autocast("cpu"):  # both default to bfloat16 on CPU
        expected, expected_dtypes = attention(torch, torch.nn.functional, torch.tensor(x),
                                              *map(torch.tensor, ws))
    with amp.autocast("cpu"):
        got, got_dtypes = attention(neural_arch, F, neural_arch.tensor(x),
                                    *map(neural_arch.tensor, ws))
    assert {k: str(v) for k, v in got_dtypes.items()} == {
        k: str(v).replace("torch.", "") for k, v in expected_dtypes.items()}
    assert got.dtype == DEFAULT_CPU_DTYPE
    np.testing.assert_allclose(got.array.astype(np.float64), expected.double().numpy(),
                               rtol=2e-2, atol=2e-2)


def test_disabled_autocast_is_a_no_op():
    plain = F.linear(neural_arch.tensor(X), neural_arch.tensor(W))
    with amp.autocast("cpu", enabled=False):
        inside = F.linear(neural_arch.tensor(X), neural_arch.tensor(W))
        assert not amp.is_autocast_enabled("cpu")
    assert inside.dtype == np.float32
    np.testing.assert_array_equal(inside.array, plain.array)


def test_nesting_restores_the_outer_state():
    assert not amp.is_autocast_enabled("cpu")
    with amp.autocast("cpu"):
        assert amp.is_autocast_enabled("cpu") and \
            amp.get_autocast_dtype("cpu") == DEFAULT_CPU_DTYPE
        with amp.autocast("cpu", enabled=False):
            assert F.linear(neural_arch.tensor(X), neural_arch.tensor(W)).dtype == np.float32
        assert amp.is_autocast_enabled("cpu")
        assert F.linear(neural_arch.tensor(X), neural_arch.tensor(W)).dtype == DEFAULT_CPU_DTYPE
    assert not amp.is_autocast_enabled("cpu")


def test_leaving_through_an_exception_restores_the_state():
    with pytest.raises(KeyError):
        with amp.autocast("cpu"):
            raise KeyError("boom")
    assert not amp.is_autocast_enabled("cpu")
    assert F.linear(neural_arch.tensor(X), neural_arch.tensor(W)).dtype == np.float32


def test_decorator_form_and_torch_top_level_name():
    @amp.autocast("cpu")
    def forward():
        return F.linear(neural_arch.tensor(X), neural_arch.tensor(W))

    assert forward().dtype == DEFAULT_CPU_DTYPE and forward().dtype == DEFAULT_CPU_DTYPE
    assert not amp.is_autocast_enabled("cpu")
    assert neural_arch.autocast is amp.autocast


def test_state_is_per_thread():
    seen = []
    with amp.autocast("cpu"):
        worker = threading.Thread(target=lambda: seen.append(amp.is_autocast_enabled("cpu")))
        worker.start()
        worker.join(timeout=10)
    assert seen == [False]


def test_cpu_autocast_leaves_other_devices_alone():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # without CUDA the region disables itself (below)
        region = amp.autocast("cuda")
    with region:
        assert amp.is_autocast_enabled("cuda") is CUDA and not amp.is_autocast_enabled("cpu")
        assert F.linear(neural_arch.tensor(X), neural_arch.tensor(W)).dtype == np.float32


@pytest.mark.skipif(CUDA, reason="a GPU is present")
def test_cuda_autocast_without_cuda_warns_and_disables_itself_as_torchs():
    with pytest.warns(UserWarning, match="CUDA is not available.*Disabling autocast"):
        region = amp.autocast("cuda")
    with region:
        assert not amp.is_autocast_enabled("cuda")
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        with pytest.warns(UserWarning, match="CUDA is not available.*Disabling autocast"):
            torch.autocast("cuda")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # enabled=False asks for nothing: no warning
        amp.autocast("cuda", enabled=False)


def test_bad_arguments_name_the_value():
    with pytest.raises(ValueError, match="device_type.*'tpu'"):
        amp.autocast("tpu")
    with pytest.raises(ValueError, match="dtype.*float64"):
        amp.autocast("cpu", dtype=neural_arch.float64)
