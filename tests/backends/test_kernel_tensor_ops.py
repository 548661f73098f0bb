"""The host-side plumbing of the fused kernels, checked on the CPU.

The autograd ops of ``core.fused_kernels`` run the float64 references on NumPy tensors, so
their graph wiring is compared here with ``neural_arch.functional``; ``optim.fused_adamw``'s
``FusedAdamW`` is run with the references standing in for the CUDA kernels; the multi-tensor
block table and the kernel argument packing are checked directly.
"""
from __future__ import annotations

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.backends.kernels import multi_tensor, pack_args, reference
from neural_arch.core import Tensor
from neural_arch.core import fused_kernels
from neural_arch.optim import AdamW, fused_adamw

pytestmark = pytest.mark.timeout(60)


def _tensor(shape, seed, scale=1.0):
    data = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * scale
    return Tensor(data, requires_grad=True)


def _grads(fn, tensors):
    for t in tensors:
        t.grad = None
    out = fn()
    out.backward()
    grads = [t.grad.array.copy() for t in tensors]
    for t in tensors:
        t.grad = None
    return out.array, grads


def _assert_same(fused, plain, rtol=2e-5, atol=2e-6):
    np.testing.assert_allclose(fused[0], plain[0], rtol=rtol, atol=atol)
    for a, b in zip(fused[1], plain[1]):
        assert a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_fused_bias_gelu_matches_functional(approximate):
    x, b = _tensor((5, 3, 16), 0, 2.0), _tensor(16, 1)
    weights = Tensor(np.random.default_rng(2).standard_normal((5, 3, 16)).astype(np.float32))
    fused = _grads(lambda: (fused_kernels.fused_bias_gelu(x, b, approximate) * weights).sum(),
                   [x, b])
    plain = _grads(lambda: (F.gelu(x + b, approximate=approximate) * weights).sum(), [x, b])
    _assert_same(fused, plain)
    no_bias = fused_kernels.fused_bias_gelu(x, None, approximate)
    assert no_bias.dtype == np.float32
    np.testing.assert_allclose(no_bias.array, F.gelu(x, approximate=approximate).array,
                               rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.15])
def test_fused_cross_entropy_matches_functional(reduction, smoothing):
    z = _tensor((9, 6), 3, 3.0)
    target = np.array([0, 5, -100, 2, 3, 3, -100, 1, 4])
    weights = Tensor(np.linspace(-1, 1, 9).astype(np.float32))

    def run(fn):
        def loss():
            out = fn(z, target, reduction=reduction, label_smoothing=smoothing)
            return (out * weights).sum() if reduction == "none" else out
        return _grads(loss, [z])

    _assert_same(run(fused_kernels.fused_cross_entropy), run(F.cross_entropy))


def test_fused_cross_entropy_mean_of_all_ignored_is_nan_with_zero_grad():
    z = _tensor((2, 3), 4)
    out = fused_kernels.fused_cross_entropy(z, np.array([-100, -100]))
    assert np.isnan(out.array)
    out.backward()
    assert not z.grad.any()


def test_fused_layer_norm_matches_functional():
    x, w, b = _tensor((4, 3, 10), 5, 2.0), _tensor((3, 10), 6), _tensor((3, 10), 7)
    weights = Tensor(np.random.default_rng(8).standard_normal((4, 3, 10)).astype(np.float32))
    fused = _grads(lambda: (fused_kernels.fused_layer_norm(x, (3, 10), w, b) * weights).sum(),
                   [x, w, b])
    plain = _grads(lambda: (F.layer_norm(x, (3, 10), w, b) * weights).sum(), [x, w, b])
    _assert_same(fused, plain, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match=r"normalized_shape \(4,\) does not match"):
        fused_kernels.fused_layer_norm(x, 4)


def test_fused_ops_record_no_graph_without_grad():
    x = Tensor(np.ones((2, 4), np.float32))
    out = fused_kernels.fused_layer_norm(x, 4)
    assert not out.requires_grad and out._backward is None


def test_fused_adamw_matches_adamw_through_the_kernel_path(monkeypatch):
    calls = []

    def reference_kernels(array):  # stand in for the CUDA kernels on CPU arrays
        calls.append(array.shape)
        return reference

    monkeypatch.setattr(fused_adamw, "optimizer_kernels", reference_kernels)
    shapes = [(6, 4), (4,), (3, 3)]
    fused = [_tensor(s, 10 + i) for i, s in enumerate(shapes)]
    plain = [Tensor(p.array.copy(), requires_grad=True) for p in fused]
    ams = Tensor(np.ones(3, np.float32), requires_grad=True)
    ams_plain = Tensor(np.ones(3, np.float32), requires_grad=True)
    opt = fused_adamw.FusedAdamW([{"params": fused}, {"params": [ams], "amsgrad": True}],
                                lr=0.05, weight_decay=0.1)
    ref = AdamW([{"params": plain}, {"params": [ams_plain], "amsgrad": True}], lr=0.05,
                weight_decay=0.1)
    rng = np.random.default_rng(11)
    for step in range(4):
        for i, (a, b) in enumerate(zip(fused + [ams], plain + [ams_plain])):
            if step == 1 and i == 1:
                a.grad = b.grad = None  # a parameter without a gradient is skipped
                continue
            g = rng.standard_normal(a.array.shape).astype(np.float32)
            a.grad, b.grad = g.copy(), g.copy()
        opt.step()
        ref.step()
    for a, b in zip(fused + [ams], plain + [ams_plain]):
        np.testing.assert_allclose(a.array, b.array, rtol=1e-6, atol=1e-7)
    assert opt.state[fused[1]]["step"] == 3 and opt.state[fused[0]]["step"] == 4
    assert (3,) not in calls  # the AMSGrad group never reaches the kernels
    assert opt.state_dict()["state"].keys() == ref.state_dict()["state"].keys()


def test_fused_adamw_on_cpu_arrays_is_adamw():
    p, q = _tensor((5,), 12), _tensor((5,), 12)
    opt, ref = fused_adamw.FusedAdamW([p], lr=0.1), AdamW([q], lr=0.1)
    p.grad = q.grad = np.arange(5, dtype=np.float32)
    opt.step()
    ref.step()
    np.testing.assert_array_equal(p.array, q.array)


@pytest.mark.parametrize("sizes,chunk", [([5000, 0, 10, 8192], 4096), ([1], 1), ([], 8),
                                         ([7, 7, 7], 3)])
def test_chunk_table_covers_every_element_once(sizes, chunk):
    block_tensor, block_start = multi_tensor.chunk_table(sizes, chunk)
    assert block_tensor.dtype == np.int32 and block_start.dtype == np.int64
    covered = [np.zeros(n, dtype=np.int64) for n in sizes]
    for t, start in zip(block_tensor, block_start):  # what each block of the kernel touches
        covered[t][start:min(start + chunk, sizes[t])] += 1
    assert all((c == 1).all() for c in covered)
    assert len(block_tensor) == sum(-(-n // chunk) for n in sizes)


def test_chunk_table_rejects_bad_input():
    with pytest.raises(ValueError, match="chunk must be positive"):
        multi_tensor.chunk_table([4], 0)
    with pytest.raises(ValueError, match="tensor 1 has negative size -2"):
        multi_tensor.chunk_table([4, -2])


class _FakeDeviceArray:
    data, dtype = object(), np.dtype(np.float32)


def test_pack_args_casts_scalars_to_the_kernel_types():
    array = _FakeDeviceArray()
    packed = pack_args("unscale_check_inf_f32", (array, 10, 0.5, array))
    assert packed[0] is array and packed[3] is array
    assert type(packed[1]) is np.int64 and type(packed[2]) is np.float32
    packed = pack_args("bias_gelu_erf_forward", (array, array, array, 2 ** 40, 7))
    assert type(packed[3]) is np.int64 and type(packed[4]) is np.int32


def test_pack_args_rejects_wrong_arguments():
    array = _FakeDeviceArray()
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        pack_args("nope", ())
    with pytest.raises(TypeError, match="takes 4 arguments"):
        pack_args("unscale_check_inf_f32", (array, 1, 0.5))
    with pytest.raises(TypeError, match="argument 0 must be a device array"):
        pack_args("unscale_check_inf_f32", (3, 1, 0.5, array))
    with pytest.raises(TypeError, match="argument 1 must be an integer"):
        pack_args("unscale_check_inf_f32", (array, 1.5, 0.5, array))
    with pytest.raises(ValueError, match="does not fit in i32"):
        pack_args("bias_gelu_erf_forward", (array, array, array, 1, 2 ** 31))
    with pytest.raises(TypeError, match="argument 2 must be a f32 scalar"):
        pack_args("unscale_check_inf_f32", (array, 1, True, array))
