"""torch's backend settings on ``neural_arch``: ``backends.cuda.matmul.allow_tf32``,
``backends.cudnn.allow_tf32`` / ``benchmark`` / ``deterministic`` (settable flags with torch's
defaults and checks) and ``set_num_threads`` / ``get_num_threads`` (the BLAS pool NumPy
uses), against torch."""
from __future__ import annotations

import os

import pytest

import neural_arch as na
from neural_arch.backends import threads

pytestmark = pytest.mark.timeout(60)

MATMUL_FLAGS = ("allow_tf32", "allow_fp16_reduced_precision_reduction",
                "allow_bf16_reduced_precision_reduction")
CUDNN_FLAGS = ("enabled", "benchmark", "deterministic", "allow_tf32")


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


@pytest.fixture
def restored_flags():
    """Put every flag back, whatever the test set."""
    matmul = {name: getattr(na.backends.cuda.matmul, name) for name in MATMUL_FLAGS}
    cudnn = {name: getattr(na.backends.cudnn, name) for name in CUDNN_FLAGS}
    yield
    for name, value in matmul.items():
        setattr(na.backends.cuda.matmul, name, value)
    for name, value in cudnn.items():
        setattr(na.backends.cudnn, name, value)


def test_flags_have_torchs_defaults(torch):
    for name in MATMUL_FLAGS:
        assert getattr(na.backends.cuda.matmul, name) is getattr(torch.backends.cuda.matmul,
                                                                 name), name
    for name in CUDNN_FLAGS:
        assert getattr(na.backends.cudnn, name) is getattr(torch.backends.cudnn, name), name


def test_flags_are_settable_and_checked_as_torch(torch, restored_flags):
    na.backends.cuda.matmul.allow_tf32 = True
    na.backends.cudnn.allow_tf32 = False
    na.backends.cudnn.benchmark = True
    na.backends.cudnn.deterministic = True
    assert na.backends.cuda.matmul.allow_tf32 is True and na.backends.cudnn.allow_tf32 is False
    assert na.backends.cudnn.benchmark is True and na.backends.cudnn.deterministic is True
    with pytest.raises(AttributeError, match="Unknown attribute allow_tf33"):
        na.backends.cuda.matmul.allow_tf33 = True
    with pytest.raises(AttributeError, match="Unknown attribute allow_tf33"):
        na.backends.cuda.matmul.allow_tf33
    with pytest.raises(AttributeError, match="Unknown attribute allow_tf33"):
        torch.backends.cuda.matmul.allow_tf33 = True
    with pytest.raises(RuntimeError, match="expects a bool, but got int"):
        na.backends.cuda.matmul.allow_tf32 = 1
    with pytest.raises(RuntimeError, match="expects a bool, but got str"):
        na.backends.cudnn.benchmark = "yes"
    with pytest.raises(RuntimeError, match="expects a bool, but got str"):
        torch.backends.cudnn.benchmark = "yes"
    assert na.backends.cudnn.is_available() is False and na.backends.cudnn.version() is None


def test_the_backends_package_keeps_its_functions():
    assert na.backends.device_type("cuda:1") == "cuda"
    assert na.backends.get_backend("numpy").name == "numpy"


@pytest.fixture
def restored_threads():
    before = na.get_num_threads()
    yield
    na.set_num_threads(before)


def test_set_num_threads_sets_the_blas_pool(restored_threads):
    threadpoolctl = pytest.importorskip("threadpoolctl")
    blas = [info for info in threadpoolctl.threadpool_info() if info["user_api"] == "blas"]
    if not blas:
        pytest.skip("threadpoolctl finds no BLAS library under NumPy")
    na.set_num_threads(1)
    assert na.get_num_threads() == 1
    assert all(info["num_threads"] == 1 for info in threadpoolctl.threadpool_info()
               if info["user_api"] == "blas")
    na.set_num_threads(2)
    assert na.get_num_threads() == 2
    assert type(na.get_num_threads()) is int


def test_set_num_threads_errors_as_torch(torch, restored_threads):
    for bad, message in ((0, "expects a positive integer"), (-1, "expects a positive integer"),
                         (2.0, "expects an int, but got float"),
                         ("2", "expects an int, but got str"),
                         (True, "expects an int, but got bool")):
        with pytest.raises(RuntimeError, match=message):
            torch.set_num_threads(bad)
        with pytest.raises(RuntimeError, match=message):
            na.set_num_threads(bad)


def test_without_threadpoolctl_the_number_goes_to_the_environment(monkeypatch):
    monkeypatch.setattr(threads, "threadpool_controller", lambda: None)
    for name in threads.THREAD_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_requested", None)
    with pytest.warns(RuntimeWarning, match="threadpoolctl is not installed"):
        na.set_num_threads(3)
    assert na.get_num_threads() == 3
    assert all(os.environ[name] == "3" for name in threads.THREAD_VARIABLES)
