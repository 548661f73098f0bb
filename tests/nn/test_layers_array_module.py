"""The sliding-window layers use only the array-module calls that NumPy and CuPy share.

CuPy's ``as_strided(x, shape, strides)`` takes no ``writeable`` (NumPy's does), so a layer
that passes it works on the CPU and raises a TypeError on the GPU. Here NumPy's ``as_strided``
is swapped for one with CuPy's signature, and every layer that views windows runs forward and
backward through it, on the CPU, against the unpatched result.
"""
import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch import nn
from neural_arch.core import Tensor, manual_seed

pytestmark = pytest.mark.timeout(60)

_numpy_as_strided = np.lib.stride_tricks.as_strided


def _cupy_signature_as_strided(x, shape=None, strides=None):
    """``cupy.lib.stride_tricks.as_strided``'s parameters: no ``subok``, no ``writeable``."""
    return _numpy_as_strided(x, shape, strides)


LAYERS = [
    ("conv2d", lambda: nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2, groups=2),
     (2, 4, 9, 8)),
    ("conv1d", lambda: nn.Conv1d(4, 6, 3, padding="same", groups=2), (2, 4, 11)),
    ("max_pool2d", lambda: nn.MaxPool2d(3, stride=2, padding=1, ceil_mode=True),
     (2, 3, 9, 8)),
    ("avg_pool2d", lambda: nn.AvgPool2d(3, stride=2, padding=1, count_include_pad=False),
     (2, 3, 9, 8)),
]


def _run(build, shape):
    manual_seed(0)
    layer = build()
    x = Tensor(np.random.default_rng(1).standard_normal(shape).astype(np.float32),
               requires_grad=True)
    out = layer(x)
    (out * out).sum().backward()
    return out.array, x.grad, [p.grad for p in layer.parameters()]


@pytest.mark.parametrize("name,build,shape", LAYERS, ids=[c[0] for c in LAYERS])
def test_window_layers_call_as_strided_as_cupy_accepts(monkeypatch, name, build, shape):
    expected = _run(build, shape)
    monkeypatch.setattr(np.lib.stride_tricks, "as_strided", _cupy_signature_as_strided)
    out, grad_x, grad_params = _run(build, shape)
    np.testing.assert_array_equal(out, expected[0])
    np.testing.assert_array_equal(grad_x, expected[1])
    for got, want in zip(grad_params, expected[2]):
        np.testing.assert_array_equal(got, want)


def test_max_pool_indices_with_cupy_signature(monkeypatch):
    monkeypatch.setattr(np.lib.stride_tricks, "as_strided", _cupy_signature_as_strided)
    x = Tensor(np.arange(32, dtype=np.float32).reshape(1, 2, 4, 4))
    out, indices = F.max_pool2d(x, 2, return_indices=True)
    np.testing.assert_array_equal(indices.array[0, 0], [[5, 7], [13, 15]])
    np.testing.assert_array_equal(out.array[0, 1], [[21, 23], [29, 31]])
