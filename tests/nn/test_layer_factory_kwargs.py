"""torch's factory keywords ``device=`` and ``dtype=`` on the convolution, batch-norm and
recurrent layers and cells: parameters and floating buffers are made in that dtype on that
device, the layer runs in it, and the defaults stay float32 on the CPU."""
import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn
from gpu_testing import GPUS

pytestmark = pytest.mark.timeout(60)

# (layer factory taking the keywords, an input of the layer's shape)
LAYERS = {
    "Conv1d": (lambda **kw: nn.Conv1d(3, 4, 3, padding=1, **kw), (2, 3, 7)),
    "Conv2d": (lambda **kw: nn.Conv2d(3, 4, 3, stride=2, groups=1, **kw), (2, 3, 7, 6)),
    "BatchNorm1d": (lambda **kw: nn.BatchNorm1d(3, **kw), (4, 3, 5)),
    "BatchNorm2d": (lambda **kw: nn.BatchNorm2d(3, **kw), (4, 3, 5, 2)),
    "LSTM": (lambda **kw: nn.LSTM(3, 4, num_layers=2, **kw), (5, 2, 3)),
    "GRU": (lambda **kw: nn.GRU(3, 4, bidirectional=True, **kw), (5, 2, 3)),
    "RNN": (lambda **kw: nn.RNN(3, 4, nonlinearity="relu", **kw), (5, 2, 3)),
    "LSTMCell": (lambda **kw: nn.LSTMCell(3, 4, **kw), (2, 3)),
    "GRUCell": (lambda **kw: nn.GRUCell(3, 4, **kw), (2, 3)),
    "RNNCell": (lambda **kw: nn.RNNCell(3, 4, **kw), (2, 3)),
}


def _first_output(out):
    while isinstance(out, tuple):
        out = out[0]
    return out


def _floating_state(layer):
    return [t for t in list(layer.parameters()) + [b for b in layer.buffers() if b is not None]
            if np.issubdtype(t.dtype, np.floating)]


@pytest.mark.parametrize("name", list(LAYERS))
@pytest.mark.parametrize("dtype", [na.float64, "float64", np.float64])
def test_layer_takes_device_and_dtype(name, dtype):
    make, shape = LAYERS[name]
    layer = make(device="cpu", dtype=dtype)
    state = _floating_state(layer)
    assert state and all(t.dtype == np.float64 and t.device == "cpu" for t in state)
    out = _first_output(layer(np.random.default_rng(0).standard_normal(shape)))
    assert out.dtype == np.float64


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_defaults_to_float32_on_the_cpu(name):
    make, shape = LAYERS[name]
    layer = make(device=None, dtype=None)
    assert all(t.dtype == np.float32 and t.device == "cpu" for t in _floating_state(layer))
    out = _first_output(layer(np.zeros(shape, np.float32)))
    assert out.dtype == np.float32


@pytest.mark.parametrize("name", ["Conv2d", "BatchNorm2d", "LSTM", "GRUCell"])
def test_layer_refuses_a_non_floating_dtype(name):
    with pytest.raises(TypeError, match="floating dtype"):
        LAYERS[name][0](dtype=na.int64)


@pytest.mark.skipif(GPUS > 0, reason="a GPU is present: the layers are built on it")
@pytest.mark.parametrize("name", ["Conv2d", "BatchNorm1d", "GRU", "LSTMCell"])
def test_layer_on_cuda_without_gpu_says_so(name):
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        LAYERS[name][0](device="cuda")
