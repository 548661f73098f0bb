"""``neural_arch.cuda`` (``torch.cuda``): availability from the CuPy backend, device count,
index, name and synchronisation, seeding; each against torch's answers on the same machine
(torch CPU here: no CUDA, so both report none; on a GPU machine both see the same GPUs)."""
from __future__ import annotations

import pytest

import neural_arch as na
from neural_arch.backends import get_backend

pytestmark = pytest.mark.timeout(60)

CUDA = get_backend("cupy").is_available()


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def test_availability_and_count_follow_the_cupy_backend(torch):
    assert na.cuda.is_available() is CUDA
    assert isinstance(na.cuda.device_count(), int)
    assert (na.cuda.device_count() > 0) is CUDA
    if torch.cuda.is_available() or CUDA:
        assert na.cuda.is_available() == torch.cuda.is_available()
        assert na.cuda.device_count() == torch.cuda.device_count()


def test_the_torch_spelling_reaches_the_same_module():
    import neural_arch.cuda as cuda_module
    assert na.cuda is cuda_module
    assert na.cuda.amp.GradScaler.__module__ == "neural_arch.cuda.amp"


def test_seeding_takes_any_integer_and_returns_none(torch):
    for seed in (0, 7, 2 ** 40):
        assert na.cuda.manual_seed(seed) is None and na.cuda.manual_seed_all(seed) is None
        assert torch.cuda.manual_seed(seed) is None
    with pytest.raises(ValueError, match="'seven'"):
        na.cuda.manual_seed("seven")
    with pytest.raises(TypeError, match="manual_seed_all"):
        na.cuda.manual_seed_all(None)


def test_set_device_rejects_a_cpu_device_as_torch(torch):
    for device in ("cpu", na.device("cpu")):
        with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
            na.cuda.set_device(device)
    with pytest.raises(ValueError, match="Expected a cuda device, but got: cpu"):
        torch.cuda.set_device("cpu")


@pytest.mark.skipif(CUDA, reason="the machine has a CUDA device")
def test_without_a_device_the_queries_raise_saying_why():
    for call in (na.cuda.current_device, na.cuda.synchronize, na.cuda.get_device_name,
                 lambda: na.cuda.set_device(0), lambda: na.cuda.set_device("cuda:0")):
        with pytest.raises(RuntimeError, match="CUDA is not available: .*(CuPy|CUDA)"):
            call()
    assert na.cuda.device_count() == 0
    assert na.cuda.is_bf16_supported() is False


@pytest.mark.skipif(not CUDA, reason="needs CuPy and a CUDA device")
def test_on_a_gpu_the_answers_are_torchs(torch):
    if not torch.cuda.is_available():
        pytest.skip("torch here has no CUDA to compare with")
    assert na.cuda.current_device() == torch.cuda.current_device() == 0
    for device in (None, 0, "cuda", "cuda:0", na.device("cuda", 0)):
        assert na.cuda.get_device_name(device) == torch.cuda.get_device_name(0)
        assert na.cuda.synchronize(device) is None
    last = na.cuda.device_count() - 1
    na.cuda.set_device(last)
    try:
        assert na.cuda.current_device() == last
        assert na.tensor([1.0], device="cuda").array.device.id == last
    finally:
        na.cuda.set_device(0)
    na.cuda.set_device(-1)  # a negative index is ignored, as in torch
    assert na.cuda.current_device() == 0
    with pytest.raises(ValueError, match="cuda:99"):
        na.cuda.get_device_name("cuda:99")
