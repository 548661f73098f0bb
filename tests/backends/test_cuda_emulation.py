"""The CUDA kernels and their Python wrappers, run end to end on the CPU.

The ``.cu`` sources are compiled as C++ against ``cuda_host_emulation.h`` (threads of a block
are real threads; ``__syncthreads`` and warp shuffles are barriers), and the wrappers of
``cupy_kernels`` run with NumPy standing in for CuPy and the emulator for ``launch`` (both
replaced in ``cupy_launch``, where the wrappers reach them). So the kernels' indexing, block
reductions and barriers, and the wrappers' launch geometry and argument lists, are checked
against the float64 references on any machine with g++, GPU or not. (The fp16 unscale kernel
uses PTX conversion instructions and is checked on the GPU only.)
"""
from __future__ import annotations

import ctypes
import shutil
import subprocess

import numpy as np
import pytest

from neural_arch.backends import cupy_kernels, cupy_launch
from neural_arch.backends.kernels import (I32, I64, F32, KERNEL_DIR, KERNELS, PTR, multi_tensor,
                                          pack_args)
from neural_arch.backends.kernels import reference as R
from repo_paths import TESTS_DIR

pytestmark = pytest.mark.timeout(300)

_HOST_SOURCES = ("gelu.cu", "cross_entropy.cu", "layer_norm.cu", "adamw.cu")
_CTYPES = {I32: ctypes.c_int32, I64: ctypes.c_int64, F32: ctypes.c_float}


@pytest.fixture(scope="module")
def emulator(tmp_path_factory):
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("g++ not found: the host emulation of the CUDA kernels needs it")
    names = [n for n, k in KERNELS.items() if k.source in _HOST_SOURCES]
    out = tmp_path_factory.mktemp("emulation")
    unit = out / "kernels_on_host.cpp"
    lines = ['#include "cuda_host_emulation.h"']
    lines += [f'#include "{KERNEL_DIR / name}"' for name in _HOST_SOURCES]
    lines.append("extern \"C\" int emu_run(const char* name, unsigned gx, unsigned gy, "
                 "unsigned bx, unsigned by, void** args) {")
    for name in names:
        lines.append(f'  if (!std::strcmp(name, "{name}")) {{ emu_launch({name}, gx, gy, bx, '
                     f"by, args); return 0; }}")
    lines += ["  return -1;", "}"]
    unit.write_text("\n".join(lines) + "\n")
    library = out / "kernels_on_host.so"
    result = subprocess.run([compiler, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread",
                             f"-I{TESTS_DIR}", str(unit), "-o",
                             str(library)], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, f"host build of the kernels failed:\n{result.stderr}"
    lib = ctypes.CDLL(str(library))
    lib.emu_run.argtypes = [ctypes.c_char_p] + [ctypes.c_uint] * 4 + [ctypes.c_void_p]
    return lib, set(names)


def _as_dims(dims) -> tuple:
    dims = tuple(dims) + (1,) * (2 - len(dims))
    return dims[0], dims[1]


@pytest.fixture
def on_host(emulator, monkeypatch):
    """``cupy_kernels`` with NumPy as its array module and the emulator as its launcher."""
    lib, names = emulator

    def launch(name, grid, block, args):
        assert name in names, f"kernel {name} is not built for host emulation"
        values = []
        for kind, value in zip(KERNELS[name].params, pack_args(name, args)):
            if kind == PTR:
                assert value.flags.c_contiguous, f"{name}: a strided array reached a kernel"
                values.append(ctypes.c_void_p(value.ctypes.data))
            else:
                values.append(_CTYPES[kind](value))
        argv = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
        assert lib.emu_run(name.encode(), *_as_dims(grid), *_as_dims(block), argv) == 0

    class HostCupy:
        ndarray = np.ndarray

        class cuda:
            class Device:
                id = -1  # keeps the constants cache apart from a real device's

        def __getattr__(self, attribute):
            return getattr(np, attribute)

    monkeypatch.setattr(cupy_launch, "array_module", lambda: HostCupy())
    monkeypatch.setattr(cupy_launch, "launch", launch)
    monkeypatch.setattr(multi_tensor, "pointer_table", lambda *lists: np.array(
        [[a.ctypes.data for a in arrays] for arrays in lists], dtype=np.uint64))
    return cupy_kernels


def _data(shape, seed, scale=1.0, offset=0.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_on_host(on_host, approximate):
    x, bias, g = _data((9, 70), 1, 3.0), _data(70, 2), _data((9, 70), 3)
    np.testing.assert_allclose(on_host.bias_gelu_forward(x, bias, approximate),
                               R.bias_gelu_forward(x, bias, approximate), rtol=1e-5, atol=1e-6)
    gx, gb = on_host.bias_gelu_backward(g, x[:, :], bias, approximate)
    rx, rb = R.bias_gelu_backward(g, x, bias, approximate)
    np.testing.assert_allclose(gx, rx, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gb, rb, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("blocks", [1, 2])
def test_bias_gelu_when_the_grid_stride_loop_wraps_rows(on_host, monkeypatch, blocks):
    # a capped grid makes each thread step by blocks * 256 elements, crossing rows of 70
    monkeypatch.setattr(cupy_launch, "_MAX_GRID_STRIDE_BLOCKS", blocks)
    x, bias, g = _data((9, 70), 7), _data(70, 8), _data((9, 70), 9)
    np.testing.assert_allclose(on_host.bias_gelu_forward(x, bias),
                               R.bias_gelu_forward(x, bias), rtol=1e-5, atol=1e-6)
    gx, _ = on_host.bias_gelu_backward(g, x, bias, "tanh")
    np.testing.assert_allclose(gx, R.bias_gelu_backward(g, x, bias, "tanh")[0], rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_keeps_relative_accuracy_in_the_negative_tail(on_host, approximate):
    # 1 + erf(v / sqrt 2) and 1 + tanh(u) cancel to zero in float32 long before GELU underflows
    x = np.linspace(-9.0, -3.0, 64, dtype=np.float32).reshape(4, 16)
    bias, g = np.zeros(16, np.float32), np.ones((4, 16), np.float32)
    out = on_host.bias_gelu_forward(x, bias, approximate)
    np.testing.assert_allclose(out, R.bias_gelu_forward(x, bias, approximate), rtol=2e-5, atol=0)
    gx, _ = on_host.bias_gelu_backward(g, x, bias, approximate)
    np.testing.assert_allclose(gx, R.bias_gelu_backward(g, x, bias, approximate)[0], rtol=2e-5,
                               atol=0)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_of_huge_logits_keeps_small_losses_exact(on_host, smoothing):
    # near 3e4 float32 steps by 1/512: a loss taken as lse - z[t] would round to that grid
    logits = np.array([[1e4, 0.0, -1e4], [-3e4, -3e4, -3e4], [3e4, 3e4 - 2.0, 3e4]], np.float32)
    target = np.array([0, 2, 1])
    loss, _ = on_host.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    ref_loss, _ = R.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("rows,classes", [(1, 1), (6, 10), (3, 1000)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_on_host(on_host, rows, classes, smoothing):
    logits = _data((rows, classes), 4, 4.0)
    target = np.random.default_rng(5).integers(0, classes, rows)
    target[1::3] = -100
    loss, lse = on_host.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    ref_loss, ref_lse = R.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6, atol=1e-5)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)
    upstream = _data(rows, 6)
    grad = on_host.cross_entropy_backward(upstream, logits, target, lse,
                                          label_smoothing=smoothing)
    ref = R.cross_entropy_backward(upstream, logits, target, ref_lse, label_smoothing=smoothing)
    np.testing.assert_allclose(grad, ref, rtol=1e-4, atol=1e-6)


# 300, 8, 4 and 2048 columns take the float4 register path (2048: two float4s per thread);
# 2052 columns are too many for it and 33 not a multiple of 4; 65 rows make the weight's and
# bias's gradients two blocks of rows (64 a block), narrow, so the emulation stays short
@pytest.mark.parametrize("rows,cols", [(1, 1), (5, 33), (3, 300), (65, 8), (3, 4), (3, 2048),
                                       (3, 2052)])
def test_layer_norm_on_host(on_host, rows, cols):
    x = _data((rows, cols), 7, 3.0, 2.0)
    weight, bias, g = _data(cols, 8), _data(cols, 9), _data((rows, cols), 10)
    y, mean, rstd = on_host.layer_norm_forward(x, weight, bias)
    ry, rmean, rrstd = R.layer_norm_forward(x, weight, bias)
    np.testing.assert_allclose(mean, rmean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(rstd, rrstd, rtol=1e-4)
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-4)
    dx, dw, db = on_host.layer_norm_backward(g, x, weight, mean, rstd)
    rdx, rdw, rdb = R.layer_norm_backward(g, x, weight, rmean, rrstd)
    np.testing.assert_allclose(dx, rdx, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(dw, rdw, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(db, rdb, rtol=1e-4, atol=1e-3)


def test_multi_tensor_adamw_on_host(on_host):
    shapes = [(5000,), (1,), (0,), (4097,), (3, 7)]
    params = [_data(s, i) for i, s in enumerate(shapes)]
    avgs = [np.zeros(s, np.float32) for s in shapes]
    sqs = [np.zeros(s, np.float32) for s in shapes]
    mine = [[a.copy() for a in arrays] for arrays in (params, avgs, sqs)]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05)
    for step in range(1, 4):
        grads = [_data(s, 20 + 10 * step + i) for i, s in enumerate(shapes)]
        on_host.adamw_step(*mine[:1], grads, *mine[1:], step=step, maximize=step == 2,
                           **hyper)
        R.adamw_step(params, grads, avgs, sqs, step=step, maximize=step == 2, **hyper)
    for got_list, ref_list in zip(mine, (params, avgs, sqs)):
        for got, ref in zip(got_list, ref_list):
            np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-7)


def _placed(values: np.ndarray, misaligned: bool) -> np.ndarray:
    """A copy of ``values`` whose data starts 16-byte aligned, or 4 bytes past such a start."""
    base = np.empty(values.size + 4, np.float32)
    start = (-base.ctypes.data % 16) // 4 + (1 if misaligned else 0)
    placed = base[start:start + values.size]
    placed[...] = values
    assert (placed.ctypes.data % 16 != 0) == misaligned
    return placed


def test_multi_tensor_adamw_vector_and_scalar_paths_agree_bit_for_bit(on_host):
    # aligned tensors take the float4 path (with a scalar tail); a misaligned one, the scalar path
    sizes = [2 * 4096 + 3, 5, 4099, 1]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05)
    start = [[_data(n, 40 + 4 * i + k) for i, n in enumerate(sizes)] for k in range(4)]
    start[3] = [np.abs(a) for a in start[3]]  # exp_avg_sq >= 0
    results = []
    for misaligned in (False, True):
        p, g, m, v = ([_placed(a, misaligned) for a in arrays] for arrays in start)
        on_host.adamw_step(p, g, m, v, step=3, **hyper)
        results.append((p, m, v))
    for aligned, scalar in zip(*results):
        for a, b in zip(aligned, scalar):
            np.testing.assert_array_equal(a, b)
    p, g, m, v = ([a.copy() for a in arrays] for arrays in start)
    R.adamw_step(p, g, m, v, step=3, **hyper)
    for got, ref in zip(results[0][0], p):
        np.testing.assert_allclose(got, ref, rtol=2e-6, atol=1e-7)


def test_cross_entropy_backward_can_skip_the_syncing_target_check(on_host, monkeypatch):
    # the range check reads a flag back from the device; the autograd op's backward skips it
    # for the targets its forward already checked
    checks = []
    monkeypatch.setattr(on_host.validate, "target_values", lambda *args: checks.append(args))
    logits, target = _data((3, 5), 30), np.array([0, 4, 2])
    loss, lse = on_host.cross_entropy_forward(logits, target)
    on_host.cross_entropy_backward(np.ones(3, np.float32), logits, target, lse,
                                   check_targets=False)
    assert len(checks) == 1
    grad = on_host.cross_entropy_backward(np.ones(3, np.float32), logits, target, lse)
    assert len(checks) == 2
    ref = R.cross_entropy_backward(np.ones(3), logits, target, R.cross_entropy_forward(
        logits, target)[1])
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("blocks", [1, 3])
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_vector_and_scalar_paths_agree_bit_for_bit(on_host, monkeypatch, blocks,
                                                             approximate):
    # 64 features and aligned arrays take the float4 path; one misaligned array, the scalar one.
    # A capped grid makes the float4 loop wrap rows too.
    monkeypatch.setattr(cupy_launch, "_MAX_GRID_STRIDE_BLOCKS", blocks)
    rows, features = 7, 64
    x, bias, g = _data(rows * features, 31, 3.0), _data(features, 32), _data(rows * features, 33)
    results = []
    for misaligned in (False, True):
        xs = _placed(x, misaligned).reshape(rows, features)
        out = on_host.bias_gelu_forward(xs, _placed(bias, False), approximate)
        gx, _ = on_host.bias_gelu_backward(_placed(g, False).reshape(rows, features), xs,
                                           _placed(bias, False), approximate)
        results.append((out, gx))
    for aligned, scalar in zip(*results):
        np.testing.assert_array_equal(aligned, scalar)
    ref = R.bias_gelu_forward(x.reshape(rows, features), bias, approximate)
    np.testing.assert_allclose(results[0][0], ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("smoothing", [0.0, 0.1])
@pytest.mark.parametrize("classes", [8, 7])  # float4 rows, and scalar ones
def test_cross_entropy_with_masked_logits(on_host, smoothing, classes):
    # -inf logits (masked classes) first, last and everywhere but the target
    logits = _data((3, classes), 41, 2.0)
    logits[0, 0] = logits[1, -1] = -np.inf
    logits[2, 1:] = -np.inf
    target = np.array([2, 0, 0])
    loss, lse = on_host.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    ref_loss, ref_lse = R.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    np.testing.assert_allclose(lse, ref_lse, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(loss, ref_loss, rtol=1e-5, atol=1e-5)  # inf where smoothing
    grad = on_host.cross_entropy_backward(np.ones(3, np.float32), logits, target, lse,
                                          label_smoothing=smoothing)
    ref = R.cross_entropy_backward(np.ones(3), logits, target, ref_lse, label_smoothing=smoothing)
    np.testing.assert_allclose(grad, ref, rtol=1e-5, atol=1e-6)


def test_layer_norm_of_a_misaligned_row_takes_the_memory_path(on_host):
    rows, cols = 4, 300  # a multiple of 4, but the view starts 4 bytes past an aligned address
    x = _data(rows * cols, 42, 3.0, 2.0)
    weight, bias, g = _data(cols, 43), _data(cols, 44), _data((rows, cols), 45)
    shifted = _placed(x, True).reshape(rows, cols)
    y, mean, rstd = on_host.layer_norm_forward(shifted, weight, bias)
    ry, rmean, rrstd = R.layer_norm_forward(x.reshape(rows, cols), weight, bias)
    np.testing.assert_allclose(y, ry, rtol=1e-4, atol=1e-4)
    dx, _, _ = on_host.layer_norm_backward(g, shifted, weight, mean, rstd)
    rdx, _, _ = R.layer_norm_backward(g, x.reshape(rows, cols), weight, rmean, rrstd)
    np.testing.assert_allclose(dx, rdx, rtol=1e-4, atol=1e-4)
