"""The convolution, pooling, batch-norm, channel-dropout and recurrent layers, and resnet8, on
CuPy ("cuda") against the same layer on the CPU: each is built on the CPU, a copy is moved with
``.to("cuda")``, both run forward and backward on the same input, and the outputs, parameter
gradients and input gradients must agree to float32 rounding. Skipped without CuPy and a CUDA
device."""
import numpy as np
import pytest

from gpu_testing import needs_gpu
from neural_arch import functional as F
from neural_arch import nn
from neural_arch.core import Tensor, manual_seed
from neural_arch.models import resnet8
from neural_arch.optim import SGD

pytestmark = [needs_gpu, pytest.mark.timeout(120)]
TOL = dict(rtol=2e-4, atol=2e-5)

# name: (layer factory, input shape)
LAYERS = {
    "conv1d": (lambda: nn.Conv1d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2),
               (2, 4, 11)),
    "conv2d": (lambda: nn.Conv2d(4, 6, (3, 2), stride=(2, 1), padding=1, dilation=(1, 2),
                                 groups=2), (2, 4, 9, 8)),
    "conv2d_same": (lambda: nn.Conv2d(3, 5, 3, padding="same", bias=False), (2, 3, 7, 6)),
    "conv2d_depthwise": (lambda: nn.Conv2d(4, 4, 3, stride=2, groups=4), (2, 4, 8, 9)),
    "max_pool2d": (lambda: nn.MaxPool2d(3, stride=2, padding=1, dilation=1, ceil_mode=True),
                   (2, 3, 9, 8)),
    "max_pool2d_dilated": (lambda: nn.MaxPool2d((3, 2), stride=(2, 3), padding=1,
                                                dilation=(2, 1)), (2, 3, 10, 9)),
    "avg_pool2d": (lambda: nn.AvgPool2d(3, stride=2, padding=1, ceil_mode=True,
                                        count_include_pad=False), (2, 3, 9, 8)),
    "adaptive_avg_pool2d": (lambda: nn.AdaptiveAvgPool2d((3, None)), (2, 3, 7, 5)),
    "batch_norm1d": (lambda: nn.BatchNorm1d(4), (6, 4, 5)),
    "batch_norm2d": (lambda: nn.BatchNorm2d(4, momentum=None), (3, 4, 5, 6)),
    "dropout2d": (lambda: nn.Dropout2d(0.4), (3, 5, 4, 4)),
    "lstm": (lambda: nn.LSTM(4, 5, num_layers=2, bidirectional=True), (6, 3, 4)),
    "gru": (lambda: nn.GRU(4, 5, batch_first=True), (3, 6, 4)),
    "rnn": (lambda: nn.RNN(4, 5, nonlinearity="relu", num_layers=2), (6, 3, 4)),
    "lstm_cell": (lambda: nn.LSTMCell(4, 5), (3, 4)),
    "gru_cell": (lambda: nn.GRUCell(4, 5), (3, 4)),
    "rnn_cell": (lambda: nn.RNNCell(4, 5), (3, 4)),
}


def _host(value):
    """A NumPy copy of a tensor or a NumPy/CuPy array."""
    if hasattr(value, "requires_grad"):
        value = value.array
    return value.get() if hasattr(value, "get") else np.asarray(value)


def _first(out):
    while isinstance(out, tuple):
        out = out[0]
    return out


def _run(layer, x, weights, device):
    """Output, input gradient and parameter gradients of sum(layer(x) * weights)."""
    manual_seed(11)  # the same dropout masks on both devices (drawn on the host)
    X = Tensor(x, requires_grad=True, device=device)
    out = _first(layer(X))
    (out * Tensor(weights[:out.array.size].reshape(out.shape), device=device)).sum().backward()
    return _host(out), _host(X.grad), {n: _host(p.grad) for n, p in layer.named_parameters()}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_on_cuda_matches_the_cpu(name):
    build, shape = LAYERS[name]
    manual_seed(0)
    cpu = build()
    manual_seed(0)
    gpu = build().to("cuda")
    assert all(p.device == "cuda" for p in gpu.parameters())
    rng = np.random.default_rng(1)
    x = rng.standard_normal(shape).astype(np.float32)
    weights = rng.standard_normal(20000).astype(np.float32)
    out_c, gx_c, gp_c = _run(cpu, x, weights, "cpu")
    out_g, gx_g, gp_g = _run(gpu, x, weights, "cuda")
    np.testing.assert_allclose(out_g, out_c, **TOL, err_msg="output")
    np.testing.assert_allclose(gx_g, gx_c, **TOL, err_msg="input gradient")
    assert sorted(gp_g) == sorted(gp_c)
    for key in gp_c:
        np.testing.assert_allclose(gp_g[key], gp_c[key], **TOL, err_msg=key)
    for (key, a), (_, b) in zip(cpu.named_buffers(), gpu.named_buffers()):
        np.testing.assert_allclose(_host(b), _host(a), **TOL, err_msg=key)


def test_max_pool_indices_on_cuda_match_the_cpu():
    x = np.random.default_rng(2).standard_normal((2, 3, 9, 8)).astype(np.float32)
    pool = nn.MaxPool2d(3, stride=2, padding=1, return_indices=True, ceil_mode=True)
    _, cpu_indices = pool(Tensor(x))
    _, gpu_indices = pool(Tensor(x, device="cuda"))
    np.testing.assert_array_equal(_host(gpu_indices), _host(cpu_indices))


def test_layers_built_on_cuda_by_keyword():
    for layer in (nn.Conv2d(3, 4, 3, device="cuda"), nn.BatchNorm2d(4, device="cuda"),
                  nn.LSTM(3, 4, device="cuda"), nn.GRUCell(3, 4, device="cuda")):
        assert all(p.device == "cuda" for p in layer.parameters()), layer
        assert all(b.device == "cuda" for b in layer.buffers() if b is not None), layer


def test_resnet8_sgd_steps_on_cuda_match_the_cpu():
    manual_seed(0)
    cpu = resnet8()
    manual_seed(0)
    gpu = resnet8().to("cuda")
    optimizers = {m: SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (cpu, gpu)}
    rng = np.random.default_rng(3)
    for step in range(2):
        x = rng.standard_normal((4, 3, 16, 16)).astype(np.float32)
        y = rng.integers(0, 10, 4)
        losses = {}
        for model, device in ((cpu, "cpu"), (gpu, "cuda")):
            optimizers[model].zero_grad()
            loss = F.cross_entropy(model(Tensor(x, device=device)),
                                   Tensor(y, device=device))
            loss.backward()
            optimizers[model].step()
            losses[device] = float(_host(loss))
        assert abs(losses["cuda"] - losses["cpu"]) < 1e-4 * max(1.0, abs(losses["cpu"])), losses
    gpu_state = dict(gpu.named_parameters())
    for name, p in cpu.named_parameters():
        np.testing.assert_allclose(_host(gpu_state[name]), _host(p), rtol=1e-3, atol=1e-4,
                                   err_msg=name)
    for (key, a), (_, b) in zip(cpu.named_buffers(), gpu.named_buffers()):
        np.testing.assert_allclose(_host(b), _host(a), rtol=1e-3, atol=1e-4, err_msg=key)
