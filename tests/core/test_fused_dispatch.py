"""When ``functional.gelu``, ``cross_entropy`` and ``layer_norm`` hand float32 GPU tensors to the
fused kernels, checked on the CPU.

A GPU array is recognised by its type's module ("cupy"). ``CupyLike`` is a NumPy array whose
type claims that module: the dispatch sees a GPU array, while the unfused code (which asks
``isinstance(..., np.ndarray)``) and the fused tensor ops (which then pick the float64
reference kernels) still run on it. So the decision, the arguments it passes on, and the
results of both paths are all checked without CuPy.
"""
from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.core import Tensor, fused_kernels
from neural_arch.core.fused_activations import (ENV_FUSED_KERNELS, _use_fused_gelu,
                                                fused_kernels_enabled, on_cuda_float32)
from neural_arch.core.fused_layers import _use_fused_layer_norm
from neural_arch.core.fused_losses import _use_fused_cross_entropy
from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


class CupyLike(np.ndarray):
    __module__ = "cupy"  # how the framework tells device arrays from host ones


@pytest.fixture(autouse=True)
def _fused_switch_unset(monkeypatch):
    monkeypatch.delenv(ENV_FUSED_KERNELS, raising=False)


def _gpu(shape, dtype=np.float32, seed=0):
    values = np.asarray(np.random.default_rng(seed).standard_normal(shape), dtype=dtype)
    return values.view(CupyLike)


def _tensor(array, requires_grad=False):
    t = Tensor(np.asarray(array), requires_grad=requires_grad)
    t.array = array  # the constructor makes a plain NumPy array; keep the GPU-looking one
    return t


def _targets(rows, classes=5):
    return np.arange(rows) % classes


# ----- the switch ----------------------------------------------------------------------------
@pytest.mark.parametrize("value,enabled", [(None, True), ("1", True), ("", True), ("0", False),
                                           (" 0 ", False), ("yes", True)])
def test_environment_switch(monkeypatch, value, enabled):
    if value is not None:
        monkeypatch.setenv(ENV_FUSED_KERNELS, value)
    assert fused_kernels_enabled() is enabled
    assert on_cuda_float32(_gpu((2, 3))) is enabled


def test_switch_is_read_on_every_call(monkeypatch):
    x = _gpu((2, 3))
    assert on_cuda_float32(x)
    monkeypatch.setenv(ENV_FUSED_KERNELS, "0")
    assert not on_cuda_float32(x)
    monkeypatch.setenv(ENV_FUSED_KERNELS, "1")
    assert on_cuda_float32(x)


def test_only_float32_gpu_arrays_qualify():
    assert on_cuda_float32(_gpu((2, 3)))
    assert not on_cuda_float32(_gpu((2, 3), np.float64))
    assert not on_cuda_float32(_gpu((2, 3), np.float16))
    assert not on_cuda_float32(np.zeros((2, 3), np.float32))
    assert not on_cuda_float32([1.0, 2.0])


# ----- the per-op predicates -----------------------------------------------------------------
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_predicate_accepts_what_the_kernel_computes(approximate):
    assert _use_fused_gelu(_gpu((4, 8)), approximate)
    assert _use_fused_gelu(_gpu((2, 3, 8)), approximate)
    assert _use_fused_gelu(_gpu((0, 8)), approximate)


@pytest.mark.parametrize("array,approximate", [
    (_gpu((4, 8), np.float64), "none"),
    (np.zeros((4, 8), np.float32), "none"),
    (_gpu((4, 8)), "sigmoid"),
    (_gpu(()), "none"),  # the kernel needs a feature dimension
    (_gpu((4, 0)), "none"),
])
def test_gelu_predicate_rejects(array, approximate):
    assert not _use_fused_gelu(array, approximate)


def test_gelu_predicate_off_with_the_switch(monkeypatch):
    monkeypatch.setenv(ENV_FUSED_KERNELS, "0")
    assert not _use_fused_gelu(_gpu((4, 8)), "none")


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("ignore_index,smoothing", [(-100, 0.0), (2, 0.1), (np.int64(-1), 1)])
def test_cross_entropy_predicate_accepts(reduction, ignore_index, smoothing):
    assert _use_fused_cross_entropy(_gpu((6, 5)), _targets(6), reduction, ignore_index, smoothing)


@pytest.mark.parametrize("logits,target,kwargs", [
    (_gpu((6, 5), np.float64), _targets(6), {}),
    (np.zeros((6, 5), np.float32), _targets(6), {}),
    (_gpu((2, 5, 3)), _targets(6).reshape(2, 3), {}),  # (N, C, d) logits
    (_gpu(5), np.array(1), {}),  # 1-D logits
    (_gpu((6, 0)), _targets(6), {}),
    (_gpu((6, 5)), np.full((6, 5), 0.2), {}),  # probability targets
    (_gpu((6, 5)), _targets(3), {}),
    (_gpu((6, 5)), _targets(6), {"reduction": "max"}),
    (_gpu((6, 5)), _targets(6), {"ignore_index": 2 ** 31}),  # beyond the kernel's int32
    (_gpu((6, 5)), _targets(6), {"ignore_index": -100.0}),
    (_gpu((6, 5)), _targets(6), {"label_smoothing": 1.5}),
])
def test_cross_entropy_predicate_rejects(logits, target, kwargs):
    args = {"reduction": "mean", "ignore_index": -100, "label_smoothing": 0.0, **kwargs}
    assert not _use_fused_cross_entropy(logits, target, **args)


def test_cross_entropy_predicate_off_with_the_switch(monkeypatch):
    monkeypatch.setenv(ENV_FUSED_KERNELS, "0")
    assert not _use_fused_cross_entropy(_gpu((6, 5)), _targets(6), "mean", -100, 0.0)


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, True), (False, False)])
def test_layer_norm_predicate_accepts(affine):
    w, b = (_tensor(_gpu(8, seed=s)) if on else None for on, s in zip(affine, (1, 2)))
    assert _use_fused_layer_norm(_gpu((3, 4, 8)), (8,), w, b, 1e-5)
    assert _use_fused_layer_norm(_gpu(8), (8,), w, b, np.float32(1e-6))


@pytest.mark.parametrize("x,shape,weight,eps", [
    (_gpu((3, 8), np.float64), (8,), None, 1e-5),
    (np.zeros((3, 8), np.float32), (8,), None, 1e-5),
    (_gpu((3, 4, 8)), (4, 8), None, 1e-5),  # several normalised dimensions
    (_gpu((3, 8)), (3, 8), None, 1e-5),
    (_gpu((3, 8)), (4,), None, 1e-5),
    (_gpu((3, 0)), (0,), None, 1e-5),
    (_gpu((3, 8)), (8,), _tensor(_gpu(8, np.float64)), 1e-5),
    (_gpu((3, 8)), (8,), Tensor(np.ones(8, np.float32)), 1e-5),  # weight on the host
    (_gpu((3, 8)), (8,), None, "1e-5"),
])
def test_layer_norm_predicate_rejects(x, shape, weight, eps):
    assert not _use_fused_layer_norm(x, shape, weight, None, eps)
    assert not _use_fused_layer_norm(x, shape, None, weight, eps)


def test_layer_norm_predicate_off_with_the_switch(monkeypatch):
    monkeypatch.setenv(ENV_FUSED_KERNELS, "0")
    assert not _use_fused_layer_norm(_gpu((3, 8)), (8,), None, None, 1e-5)


# ----- the functional ops call the fused ones exactly when the predicate says so -------------
class _Recorder:
    """Stands in for a fused tensor op: records the call, returns a sentinel."""

    def __init__(self):
        self.calls = []
        self.result = Tensor(np.zeros(1, np.float32))

    def __call__(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.result


@pytest.fixture
def stubs(monkeypatch):
    recorders = {name: _Recorder() for name in
                 ("fused_bias_gelu", "fused_cross_entropy", "fused_layer_norm")}
    for name, recorder in recorders.items():
        monkeypatch.setattr(fused_kernels, name, recorder)
    return recorders


def test_gelu_calls_the_fused_op(stubs):
    x = _tensor(_gpu((4, 8)))
    assert F.gelu(x, approximate="tanh") is stubs["fused_bias_gelu"].result
    assert stubs["fused_bias_gelu"].calls == [((x, None, "tanh"), {})]


def test_cross_entropy_calls_the_fused_op(stubs):
    z, target = _tensor(_gpu((6, 5))), Tensor(_targets(6))
    out = F.cross_entropy(z, target, reduction="sum", ignore_index=3, label_smoothing=0.2)
    assert out is stubs["fused_cross_entropy"].result
    (args, kwargs), = stubs["fused_cross_entropy"].calls
    assert args[0] is z and args[2:] == ("sum", 3, 0.2) and not kwargs
    np.testing.assert_array_equal(args[1], _targets(6))


def test_layer_norm_calls_the_fused_op(stubs):
    x, w, b = _tensor(_gpu((3, 8))), _tensor(_gpu(8, seed=1)), _tensor(_gpu(8, seed=2))
    assert F.layer_norm(x, 8, w, b, eps=1e-6) is stubs["fused_layer_norm"].result
    assert stubs["fused_layer_norm"].calls == [((x, (8,), w, b, 1e-6), {})]


def _call_all(x, z, w):
    F.gelu(x)
    F.cross_entropy(z, _targets(z.array.shape[0]))
    F.layer_norm(x, x.array.shape[-1], w, None)


def _no_calls(stubs):
    return all(not recorder.calls for recorder in stubs.values())


def test_cpu_tensors_take_the_unfused_path(stubs):
    x, z = Tensor(np.ones((3, 8), np.float32)), Tensor(np.ones((6, 5), np.float32))
    _call_all(x, z, Tensor(np.ones(8, np.float32)))
    assert _no_calls(stubs)


def test_the_switch_turns_the_dispatch_off(stubs, monkeypatch):
    monkeypatch.setenv(ENV_FUSED_KERNELS, "0")
    _call_all(_tensor(_gpu((3, 8))), _tensor(_gpu((6, 5))), _tensor(_gpu(8)))
    assert _no_calls(stubs)


def test_float64_gpu_tensors_take_the_unfused_path(stubs):
    x = _tensor(_gpu((3, 8), np.float64))
    _call_all(x, _tensor(_gpu((6, 5), np.float64)), _tensor(_gpu(8, np.float64)))
    assert _no_calls(stubs)


def test_what_the_kernels_cannot_do_falls_through_without_raising(stubs):
    x = _tensor(_gpu((3, 4, 8)))
    plain = F.layer_norm(Tensor(x.array.view(np.ndarray)), (4, 8))
    np.testing.assert_array_equal(F.layer_norm(x, (4, 8)).array, plain.array)
    z = _tensor(_gpu((6, 5)))
    soft = np.full((6, 5), 0.2, np.float32)
    np.testing.assert_array_equal(F.cross_entropy(z, soft).array,
                                  F.cross_entropy(Tensor(z.array.view(np.ndarray)), soft).array)
    F.cross_entropy(_tensor(_gpu((2, 5, 3))), _targets(6).reshape(2, 3))
    F.gelu(_tensor(_gpu(())))
    with pytest.raises(ValueError, match="approximate must be 'none' or 'tanh'"):
        F.gelu(x, approximate="sigmoid")  # the unfused path's own error
    assert _no_calls(stubs)


# ----- end to end: through the fused tensor ops (reference kernels on the CPU) -------------
def _forward_backward(fn, leaves, monkeypatch, fused):
    monkeypatch.setenv(ENV_FUSED_KERNELS, "1" if fused else "0")
    for t in leaves:
        t.grad = None
    out = fn()
    weights = np.linspace(-1.0, 1.0, out.array.size).reshape(out.array.shape).astype(np.float64)
    (out * Tensor(weights)).sum().backward()  # float64 upstream gradients reach the op
    return out.array, [t.grad.array.copy() for t in leaves]


def _assert_paths_agree(fn, leaves, monkeypatch, spy, rtol=2e-5, atol=2e-6):
    fused = _forward_backward(fn, leaves, monkeypatch, fused=True)
    assert spy.calls, "the fused op was not used"
    plain = _forward_backward(fn, leaves, monkeypatch, fused=False)
    assert len(spy.calls) == 1, "the switch did not turn the fused op off"
    np.testing.assert_allclose(fused[0], plain[0], rtol=rtol, atol=atol)
    assert fused[0].dtype == plain[0].dtype == np.float32
    for a, b in zip(fused[1], plain[1]):
        assert a.dtype == b.dtype == np.float32
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


class _Spy:
    def __init__(self, monkeypatch, name):
        self.calls, real = [], getattr(fused_kernels, name)

        def spy(*args, **kwargs):
            self.calls.append(args)
            return real(*args, **kwargs)

        monkeypatch.setattr(fused_kernels, name, spy)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_fused_and_unfused_agree(monkeypatch, approximate):
    x = _tensor(_gpu((3, 4, 16), seed=3) * 2, requires_grad=True)
    spy = _Spy(monkeypatch, "fused_bias_gelu")
    _assert_paths_agree(lambda: F.gelu(x, approximate=approximate), [x], monkeypatch, spy)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_fused_and_unfused_agree(monkeypatch, reduction, smoothing):
    z = _tensor(_gpu((9, 7), seed=4) * 3, requires_grad=True)
    target = np.array([0, 6, 2, 2, 5, 1, 2, 4, 3])
    spy = _Spy(monkeypatch, "fused_cross_entropy")
    _assert_paths_agree(lambda: F.cross_entropy(z, target, reduction=reduction, ignore_index=2,
                                                label_smoothing=smoothing),
                        [z], monkeypatch, spy)


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_layer_norm_fused_and_unfused_agree(monkeypatch, affine):
    x = _tensor(_gpu((3, 4, 10), seed=5) * 2 + 1, requires_grad=True)
    w, b = (_tensor(_gpu(10, seed=s), requires_grad=True) if on else None
            for on, s in zip(affine, (6, 7)))
    leaves = [t for t in (x, w, b) if t is not None]
    spy = _Spy(monkeypatch, "fused_layer_norm")
    _assert_paths_agree(lambda: F.layer_norm(x, (10,), w, b, eps=1e-4), leaves, monkeypatch,
                        spy, rtol=1e-4, atol=1e-5)


def test_modules_reach_the_fused_ops(stubs):
    from neural_arch import nn
    ln = nn.LayerNorm(8)
    for p in (ln.weight, ln.bias):
        p.array = p.array.view(CupyLike)
    x = _tensor(_gpu((2, 8)))
    ln(x), nn.GELU()(x), nn.CrossEntropyLoss()(_tensor(_gpu((6, 5))), _targets(6))
    assert all(len(recorder.calls) == 1 for recorder in stubs.values())


def test_importing_the_framework_loads_neither_the_kernels_nor_cupy():
    # the core reaches fused_kernels only when a GPU tensor asks, so CuPy stays optional
    code = ("import sys, neural_arch.functional; "
            "print(sorted(m for m in ('cupy', 'neural_arch.core.fused_kernels') "
            "if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "NEURAL_ARCH_DEVICE"}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, cwd=REPO_ROOT, timeout=60,
                            check=False)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"
