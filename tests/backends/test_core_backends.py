"""The array-module registry, the CuPy backend's failure mode and broadcasting properties."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import neural_arch.backends as backends
from neural_arch import Tensor
from neural_arch.core import unbroadcast

pytestmark = pytest.mark.timeout(60)


def test_registry_resolves_arrays_tensors_and_devices():
    numpy_backend = backends.get_backend("numpy")
    assert numpy_backend.name == "numpy" and numpy_backend.device == "cpu"
    assert numpy_backend.xp is np
    assert backends.backend_for(np.zeros(2)) is numpy_backend
    assert backends.backend_for(np.float32(1.0)) is numpy_backend
    assert backends.backend_for(Tensor([1.0])) is numpy_backend
    assert backends.backend_for("cpu") is numpy_backend
    assert backends.xp_of(np.ones(1)) is np
    assert backends.device_type("cuda:1") == "cuda" and backends.device_type(None) == "cpu"
    assert backends.available_backends() == ["cupy", "numba", "numpy"]
    with pytest.raises(ValueError, match="unknown backend 'jax'; registered backends"):
        backends.get_backend("jax")
    with pytest.raises(ValueError, match="unknown device 'tpu:0'"):
        backends.device_type("tpu:0")
    np.testing.assert_array_equal(numpy_backend.asarray([1, 2], dtype=np.float32),
                                  np.array([1, 2], dtype=np.float32))


def test_cupy_backend_imports_and_explains_missing_gpu():
    cupy_backend = backends.get_backend("cupy")
    assert cupy_backend.name == "cupy" and cupy_backend.device == "cuda"
    if cupy_backend.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        cupy_backend.xp
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        cupy_backend.asarray([1.0])


def test_numpy_backend_erf_matches_math_erf_on_random_points():
    points = np.random.default_rng().standard_normal(2000) * 3
    expected = np.array([math.erf(p) for p in points])
    result = backends.get_backend("numpy").erf(points)
    np.testing.assert_allclose(result, expected, rtol=1e-14, atol=0)
    half = backends.get_backend("numpy").erf(points.astype(np.float16))
    assert half.dtype == np.float16
    np.testing.assert_allclose(half, expected, atol=2e-3)
    with pytest.raises(TypeError, match="erf needs a floating array, got dtype int64"):
        backends.get_backend("numpy").erf(np.arange(3))


@st.composite
def broadcastable_pair(draw):
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, max_side=4))
    other = draw(hnp.broadcastable_shapes(shape, min_dims=0, max_dims=4, max_side=4))
    return shape, other


@settings(max_examples=60, deadline=None)
@given(broadcastable_pair())
def test_binary_op_gradients_sum_over_broadcast_axes(shapes):
    a_shape, b_shape = shapes
    rng = np.random.default_rng()
    a = Tensor(rng.standard_normal(a_shape), requires_grad=True)
    b = Tensor(rng.standard_normal(b_shape), requires_grad=True)
    out = a * b + a
    weights = rng.standard_normal(out.shape)
    (out * weights).sum().backward()
    full_a, full_b = np.broadcast_arrays(a.array, b.array)
    expected_a = unbroadcast_reference(weights * (full_b + 1.0), a_shape)
    expected_b = unbroadcast_reference(weights * full_a, b_shape)
    assert a.grad.shape == a_shape and b.grad.shape == b_shape
    np.testing.assert_allclose(a.grad, expected_a, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(b.grad, expected_b, rtol=1e-10, atol=1e-12)


def unbroadcast_reference(grad, shape):
    """Independent reference: sum each output element into the input element it came from."""
    result = np.zeros(shape)
    padded = (1,) * (grad.ndim - len(shape)) + tuple(shape)
    for index in np.ndindex(*grad.shape):
        source = tuple(0 if n == 1 else i for i, n in zip(index, padded))
        result.reshape(padded)[source] += grad[index]
    return result


def test_unbroadcast_rejects_impossible_shapes():
    with pytest.raises(ValueError, match=r"cannot reduce gradient of shape \(3, 4\) to shape "
                                         r"\(2, 4\)"):
        unbroadcast(np.ones((3, 4)), (2, 4))
    with pytest.raises(ValueError, match=r"of shape \(4,\) to shape \(2, 4\)"):
        unbroadcast(np.ones(4), (2, 4))


def test_allocator_tuning_can_be_switched_off():
    import os
    import platform
    import subprocess
    import sys

    code = "import neural_arch.backends.allocator as a, neural_arch; print(a._applied)"
    env_off = {**os.environ, "NEURAL_ARCH_TUNE_MALLOC": "0"}
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env_off, timeout=60)
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        timeout=60)
    assert off.stdout.strip() == "False", off.stderr
    expected = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert on.stdout.strip() == str(expected), on.stderr
