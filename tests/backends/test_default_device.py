"""The default device of new tensors (``NEURAL_ARCH_DEVICE`` / ``set_default_device``) and the
Numba backend's place in the registry.

"cuda" runs everywhere against ``fake_cupy``, a NumPy-backed CuPy stand-in bound into the CuPy
backend module (which holds the ``cupy`` it imported, or None).
"""
from __future__ import annotations

import numpy as np
import pytest

import fake_cupy
import neural_arch as na
from neural_arch import Tensor, backends
from neural_arch.backends import ENV_DEVICE, default_device, set_default_device

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(autouse=True)
def clean_default(monkeypatch):
    monkeypatch.delenv(ENV_DEVICE, raising=False)
    set_default_device(None)
    yield
    set_default_device(None)


@pytest.fixture
def fake_gpu(monkeypatch):
    cupy_backend = backends.get_backend("cupy")
    _bind(monkeypatch, cupy_backend, fake_cupy, None)
    return cupy_backend


def _bind(monkeypatch, cupy_backend, module, import_error) -> None:
    monkeypatch.setattr(cupy_backend, "_cupy", module)
    monkeypatch.setattr(cupy_backend, "_IMPORT_ERROR", import_error)
    # forget (and afterwards restore) a remembered "device found", where the backend keeps one
    monkeypatch.setattr(cupy_backend, "_device_seen", False, raising=False)


def _on_fake_gpu(t: Tensor) -> bool:
    return isinstance(t.array, fake_cupy.ndarray) and t.device == "cuda"


def test_default_is_cpu_when_unset_or_empty(monkeypatch):
    assert default_device() == "cpu" and na.default_device() == "cpu"
    assert type(Tensor([1, 2]).array) is np.ndarray
    monkeypatch.setenv(ENV_DEVICE, "")
    assert default_device() == "cpu"
    for value, expected in (("cpu", "cpu"), ("CUDA", "cuda"), ("cuda:1", "cuda"), ("gpu", "cuda")):
        monkeypatch.setenv(ENV_DEVICE, value)
        assert default_device() == expected, value


def test_env_cuda_puts_host_data_and_factories_on_the_gpu(monkeypatch, fake_gpu):
    monkeypatch.setenv(ENV_DEVICE, "cuda")
    host = np.arange(3, dtype=np.float32)
    made = [Tensor([1, 2]), Tensor(host), Tensor(2.5), Tensor(np.float32(1.0)),
            na.tensor([1.0]), na.zeros(2), na.ones(2, 3), na.full(2, 7.0), na.eye(2),
            na.randn(3, seed=0), na.rand(3, seed=0), na.arange(4)]
    assert all(_on_fake_gpu(t) for t in made), [t.device for t in made]
    np.testing.assert_array_equal(made[1].numpy(), host)
    assert made[0].dtype == np.int64 and made[1].dtype == np.float32
    # a device array stays where it is
    device_array = fake_cupy.asarray(np.ones(2))
    assert Tensor(device_array).array is device_array


def test_explicit_cpu_tensors_and_their_op_results_stay_on_the_host(monkeypatch, fake_gpu):
    monkeypatch.setenv(ENV_DEVICE, "cuda")
    a = Tensor([1.0, 2.0], device="cpu", requires_grad=True)
    b = Tensor(np.array([3.0, 4.0], dtype=np.float32), device="cpu")
    loss = ((a * b + a - 1.0) * [2.0, 2.0]).sum()
    assert type(loss.array) is np.ndarray and loss.device == "cpu"
    loss.backward()
    assert type(a.grad.array) is np.ndarray
    np.testing.assert_allclose(a.grad, [8.0, 10.0])
    # already placed: a CPU tensor, its copies and like-factories keep the host
    assert Tensor(a).device == "cpu" and na.tensor(a).device == "cpu"
    assert na.zeros_like(a).device == "cpu" and na.ones_like(b).device == "cpu"
    shared = np.zeros(2)
    assert na.from_numpy(shared).array is shared


def test_set_default_device_overrides_env_and_none_restores_it(monkeypatch, fake_gpu):
    monkeypatch.setenv(ENV_DEVICE, "cuda")
    na.set_default_device("cpu")
    assert default_device() == "cpu" and Tensor([1.0]).device == "cpu"
    set_default_device(None)
    assert default_device() == "cuda" and _on_fake_gpu(Tensor([1.0]))
    monkeypatch.delenv(ENV_DEVICE)
    set_default_device("cuda:0")
    assert _on_fake_gpu(na.zeros(1))
    set_default_device(None)
    assert default_device() == "cpu" and Tensor([1.0]).device == "cpu"


@pytest.mark.parametrize("value", ["tpu", "cuda:x", "cpu0", "mps"])
def test_bad_env_value_names_the_variable_and_value(monkeypatch, value):
    monkeypatch.setenv(ENV_DEVICE, value)
    pattern = f"NEURAL_ARCH_DEVICE='{value}'.*'cpu', 'cuda', 'cuda:N' or 'gpu'"
    with pytest.raises(ValueError, match=pattern):
        default_device()
    with pytest.raises(ValueError, match=pattern):
        Tensor([1.0])
    assert Tensor([1.0], device="cpu").device == "cpu"  # an explicit device never asks


def test_bad_set_default_device_keeps_the_old_default():
    with pytest.raises(ValueError, match="'tpu:0' is not a device"):
        set_default_device("tpu:0")
    assert default_device() == "cpu"


def test_default_cuda_without_cupy_raises_the_backends_install_hint(monkeypatch):
    cupy_backend = backends.get_backend("cupy")
    _bind(monkeypatch, cupy_backend, None, ImportError("No module named 'cupy'"))
    monkeypatch.setenv(ENV_DEVICE, "cuda")
    with pytest.raises(RuntimeError, match="CuPy is not installed.*cupy-cuda12x"):
        Tensor([1.0])
    with pytest.raises(RuntimeError, match="CuPy is not installed"):
        na.zeros(2)


def test_numba_backend_is_registered_and_holds_numpy_arrays():
    numba = backends.get_backend("numba")
    assert numba.name == "numba" and numba.device == "cpu" and numba.xp is np
    array = numba.asarray([1, 2], dtype=np.float32)
    assert type(array) is np.ndarray and array.dtype == np.float32
    assert numba.array_type is np.ndarray and numba.to_numpy(array) is array
    np.testing.assert_allclose(numba.erf(np.array([0.0, 10.0])), [0.0, 1.0])
    assert backends.backend_for(array) is backends.get_backend("numpy")
    assert backends.available_backends() == ["cupy", "numba", "numpy"]
