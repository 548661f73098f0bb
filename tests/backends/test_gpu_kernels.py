"""Every CUDA kernel against its float64 NumPy reference, on a GPU through CuPy.

Skipped without CuPy or without a CUDA device. Tolerances: elementwise float32 math within
1e-5 relative; row reductions (softmax, LayerNorm statistics) within a few 1e-5; column sums
over many rows within 1e-4; unscaling by a power of two is exact (one rounding on both sides).
"""
from __future__ import annotations

import numpy as np
import pytest

cp = pytest.importorskip("cupy", reason="CuPy is not installed")
try:
    _DEVICES = cp.cuda.runtime.getDeviceCount()
except Exception:  # a CuPy without a usable driver
    _DEVICES = 0
if _DEVICES == 0:
    pytest.skip("no CUDA device: CuPy found none", allow_module_level=True)

import neural_arch.functional as F  # noqa: E402
from neural_arch.backends import cupy_kernels as K  # noqa: E402
from neural_arch.backends import cupy_launch  # noqa: E402
from neural_arch.backends.kernels import reference as R  # noqa: E402
from neural_arch.core import Tensor, fused_kernels  # noqa: E402
from neural_arch.core.fused_activations import ENV_FUSED_KERNELS  # noqa: E402
from neural_arch.optim import AdamW  # noqa: E402
from neural_arch.optim.fused_adamw import FusedAdamW  # noqa: E402

pytestmark = pytest.mark.timeout(180)


def _data(shape, seed=0, scale=1.0, offset=0.0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) * scale + offset).astype(np.float32)


def _close(gpu, expected, rtol, atol):
    np.testing.assert_allclose(cp.asnumpy(gpu).astype(np.float64), expected, rtol=rtol,
                               atol=atol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("shape", [(1, 1), (33, 257), (4, 16, 768)])
def test_bias_gelu(approximate, shape):
    x, bias, g = _data(shape, 1, 3.0), _data(shape[-1:], 2), _data(shape, 3)
    out = K.bias_gelu_forward(cp.asarray(x), cp.asarray(bias), approximate)
    assert out.dtype == cp.float32 and out.shape == shape
    _close(out, R.bias_gelu_forward(x, bias, approximate), 1e-5, 1e-6)
    gx, gb = K.bias_gelu_backward(cp.asarray(g), cp.asarray(x), cp.asarray(bias), approximate)
    rx, rb = R.bias_gelu_backward(g, x, bias, approximate)
    _close(gx, rx, 1e-5, 1e-6)
    _close(gb, rb, 1e-4, 1e-4)


@pytest.mark.parametrize("blocks", [1, 3])
def test_bias_gelu_when_the_grid_stride_loop_wraps_rows(monkeypatch, blocks):
    monkeypatch.setattr(cupy_launch, "_MAX_GRID_STRIDE_BLOCKS", blocks)
    x, bias, g = _data((33, 257), 7), _data(257, 8), _data((33, 257), 9)
    _close(K.bias_gelu_forward(cp.asarray(x), cp.asarray(bias)), R.bias_gelu_forward(x, bias),
           1e-5, 1e-6)
    gx, _ = K.bias_gelu_backward(cp.asarray(g), cp.asarray(x), cp.asarray(bias), "tanh")
    _close(gx, R.bias_gelu_backward(g, x, bias, "tanh")[0], 1e-5, 1e-6)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_vector_and_scalar_paths_agree_bit_for_bit(approximate):
    # fresh arrays with 768 features take the float4 path; a view one element in, the scalar one
    rows, features = 33, 768
    x, bias, g = _data(rows * features, 31, 3.0), _data(features, 32), _data(rows * features, 33)
    results = []
    for misaligned in (False, True):
        xs = cp.asarray(x)
        if misaligned:
            base = cp.zeros(x.size + 1, cp.float32)
            base[1:] = xs
            xs = base[1:]
        xs = xs.reshape(rows, features)
        out = K.bias_gelu_forward(xs, cp.asarray(bias), approximate)
        gx, _ = K.bias_gelu_backward(cp.asarray(g).reshape(rows, features), xs, cp.asarray(bias),
                                     approximate)
        results.append((cp.asnumpy(out), cp.asnumpy(gx)))
    for aligned, scalar in zip(*results):
        np.testing.assert_array_equal(aligned, scalar)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu_keeps_relative_accuracy_in_the_negative_tail(approximate):
    x = np.linspace(-9.0, -3.0, 64, dtype=np.float32).reshape(4, 16)
    bias, g = np.zeros(16, np.float32), np.ones((4, 16), np.float32)
    out = K.bias_gelu_forward(cp.asarray(x), cp.asarray(bias), approximate)
    _close(out, R.bias_gelu_forward(x, bias, approximate), 2e-5, 0)
    gx, _ = K.bias_gelu_backward(cp.asarray(g), cp.asarray(x), cp.asarray(bias), approximate)
    _close(gx, R.bias_gelu_backward(g, x, bias, approximate)[0], 2e-5, 0)


def test_gelu_without_bias_and_non_contiguous_input():
    x = _data((64, 96), 4, 2.0)
    strided = cp.asarray(x)[:, ::3]
    out = K.bias_gelu_forward(strided)
    _close(out, R.bias_gelu_forward(x[:, ::3]), 1e-5, 1e-6)
    gx, gb = K.bias_gelu_backward(cp.ones_like(strided), strided)
    assert gb is None
    _close(gx, R.bias_gelu_backward(np.ones_like(x[:, ::3]), x[:, ::3])[0], 1e-5, 1e-6)


@pytest.mark.parametrize("rows,classes", [(1, 1), (7, 10), (64, 1000), (8, 50257)])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_softmax_cross_entropy(rows, classes, smoothing):
    logits = _data((rows, classes), 5, 4.0)
    target = np.random.default_rng(6).integers(0, classes, rows)
    target[::3] = -100
    loss, lse = K.cross_entropy_forward(cp.asarray(logits), cp.asarray(target),
                                        label_smoothing=smoothing)
    ref_loss, ref_lse = R.cross_entropy_forward(logits, target, label_smoothing=smoothing)
    _close(lse, ref_lse, 1e-5, 1e-5)
    _close(loss, ref_loss, 1e-5, 1e-4)
    upstream = _data((rows,), 7)
    grad = K.cross_entropy_backward(cp.asarray(upstream), cp.asarray(logits),
                                    cp.asarray(target), lse, label_smoothing=smoothing)
    ref = R.cross_entropy_backward(upstream, logits, target, ref_lse, label_smoothing=smoothing)
    _close(grad, ref, 1e-4, 1e-6)


def test_cross_entropy_huge_logits_and_bad_targets():
    logits = cp.asarray(np.array([[1e4, 0.0, -1e4], [-3e4, -3e4, -3e4]], np.float32))
    loss, _ = K.cross_entropy_forward(logits, cp.asarray([0, 2]))
    _close(loss, [0.0, np.log(3.0)], 1e-6, 1e-6)
    with pytest.raises(ValueError, match="target value 3 is out of range for 3 classes"):
        K.cross_entropy_forward(logits, cp.asarray([3, 0]))


@pytest.mark.parametrize("rows,cols", [(1, 1), (5, 33), (300, 768), (2, 4097), (3, 2048),
                                       (3, 2052)])
def test_layer_norm(rows, cols):
    x = _data((rows, cols), 8, 3.0, 2.0)
    weight, bias, g = _data(cols, 9), _data(cols, 10), _data((rows, cols), 11)
    y, mean, rstd = K.layer_norm_forward(cp.asarray(x), cp.asarray(weight), cp.asarray(bias))
    ry, rmean, rrstd = R.layer_norm_forward(x, weight, bias)
    _close(mean, rmean, 1e-5, 1e-5)
    _close(rstd, rrstd, 1e-4, 1e-6)
    _close(y, ry, 1e-4, 1e-4)
    dx, dw, db = K.layer_norm_backward(cp.asarray(g), cp.asarray(x), cp.asarray(weight),
                                       mean, rstd)
    rdx, rdw, rdb = R.layer_norm_backward(g, x, weight, rmean, rrstd)
    _close(dx, rdx, 1e-4, 1e-4)
    _close(dw, rdw, 1e-4, 1e-3)
    _close(db, rdb, 1e-4, 1e-3)


def test_layer_norm_without_affine_parameters():
    x = _data((16, 40), 12)
    y, mean, rstd = K.layer_norm_forward(cp.asarray(x))
    _close(y, R.layer_norm_forward(x)[0], 1e-4, 1e-5)
    dx, dw, db = K.layer_norm_backward(cp.ones((16, 40), cp.float32), cp.asarray(x), None,
                                       mean, rstd)
    _close(dx, np.zeros((16, 40)), 0, 1e-5)
    _close(db, np.full(40, 16.0), 1e-6, 1e-6)


@pytest.mark.parametrize("maximize", [False, True])
def test_multi_tensor_adamw(maximize):
    shapes = [(3000, 7), (1,), (0,), (4096,), (4097,), (64, 64)]
    params = [_data(s, i) for i, s in enumerate(shapes)]
    avgs = [np.zeros(s, np.float32) for s in shapes]
    sqs = [np.zeros(s, np.float32) for s in shapes]
    gpu = [[cp.asarray(a) for a in arrays] for arrays in (params, avgs, sqs)]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05,
                 maximize=maximize)
    for step in range(1, 4):
        grads = [_data(s, 100 + 10 * step + i) for i, s in enumerate(shapes)]
        K.adamw_step(gpu[0], [cp.asarray(g) for g in grads], gpu[1], gpu[2], step=step, **hyper)
        R.adamw_step(params, grads, avgs, sqs, step=step, **hyper)
    for got_list, ref_list in zip(gpu, (params, avgs, sqs)):
        for got, ref in zip(got_list, ref_list):
            _close(got, ref, 1e-5, 1e-6)


def test_multi_tensor_adamw_vector_and_scalar_paths_agree_bit_for_bit():
    # fresh CuPy arrays are aligned (float4 path); views one element in are not (scalar path)
    sizes = [2 * 4096 + 3, 5, 4099, 1]
    hyper = dict(lr=1e-2, beta1=0.9, beta2=0.999, eps=1e-8, weight_decay=0.05)
    start = [[_data(n, 40 + 4 * i + k) for i, n in enumerate(sizes)] for k in range(4)]
    start[3] = [np.abs(a) for a in start[3]]

    def placed(values, misaligned):
        if not misaligned:
            return cp.asarray(values)
        base = cp.zeros(values.size + 1, cp.float32)
        base[1:] = cp.asarray(values)
        return base[1:]

    results = []
    for misaligned in (False, True):
        p, g, m, v = ([placed(a, misaligned) for a in arrays] for arrays in start)
        K.adamw_step(p, g, m, v, step=3, **hyper)
        results.append([cp.asnumpy(a) for a in p + m + v])
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)


def test_adamw_rejects_non_contiguous_parameters():
    p = cp.zeros((4, 4), cp.float32)[:, ::2]
    with pytest.raises(ValueError, match="must be C-contiguous"):
        K.adamw_step([p], [cp.zeros((4, 2), cp.float32)], [cp.zeros((4, 2), cp.float32)],
                     [cp.zeros((4, 2), cp.float32)], step=1, lr=0.1, beta1=0.9, beta2=0.9,
                     eps=1e-8, weight_decay=0.0)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_unscale_and_check_inf(dtype):
    grads = [_data((1000,), 13, 100.0).astype(dtype), _data((3, 5), 14).astype(dtype)]
    device = [cp.asarray(g) for g in grads]
    flag = K.unscale_and_check_inf(device, 1.0 / 1024)
    ref_flag = R.unscale_and_check_inf(grads, 1.0 / 1024)
    assert float(flag[0]) == float(ref_flag[0]) == 0.0
    for got, ref in zip(device, grads):
        np.testing.assert_array_equal(cp.asnumpy(got), ref)  # power-of-two scale: exact
    bad = cp.asarray(np.array([1.0, np.nan, 2.0, np.inf], dtype=dtype))
    flag = K.unscale_and_check_inf([bad], 0.3, found_inf=flag)
    assert float(flag[0]) == 1.0
    np.testing.assert_allclose(cp.asnumpy(bad)[[0, 2]].astype(np.float64), [0.3, 0.6],
                               rtol=1e-3 if dtype == np.float16 else 1e-7)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
@pytest.mark.parametrize("offset", [0, 1])
@pytest.mark.parametrize("bad_at", [None, 3, 1001])
def test_unscale_vector_path_tail_and_misaligned_views(dtype, offset, bad_at):
    # 1003 elements: whole 16-byte vectors plus a tail (offset 0), or all scalar (offset 1)
    values = _data((1003,), 40, 50.0).astype(dtype)
    if bad_at is not None:
        values[bad_at] = np.inf
    base = cp.zeros(values.size + offset, dtype)
    base[offset:] = cp.asarray(values)
    flag = K.unscale_and_check_inf([base[offset:]], 0.25)
    assert float(flag[0]) == (0.0 if bad_at is None else 1.0)
    np.testing.assert_array_equal(cp.asnumpy(base[offset:]), values * dtype(0.25))


def test_fused_ops_match_functional_on_cuda(monkeypatch):
    x = Tensor(_data((6, 8, 32), 15, 2.0), device="cuda", requires_grad=True)
    w = Tensor(_data(32, 16), device="cuda", requires_grad=True)
    b = Tensor(_data(32, 17), device="cuda", requires_grad=True)
    out = fused_kernels.fused_cross_entropy(
        fused_kernels.fused_bias_gelu(fused_kernels.fused_layer_norm(x, 32, w, b), b)
        .reshape(-1, 32), cp.asarray(np.arange(48) % 32))
    out.backward()
    fused = [cp.asnumpy(t.grad.array) for t in (x, w, b)]
    for t in (x, w, b):
        t.grad = None
    monkeypatch.setenv(ENV_FUSED_KERNELS, "0")  # else F runs these same kernels
    spies = _spy_on_fused_ops(monkeypatch)
    ref = F.cross_entropy(F.gelu(F.layer_norm(x, 32, w, b) + b).reshape(-1, 32),
                          cp.asarray(np.arange(48) % 32))
    ref.backward()
    assert not any(spies.values()), "the reference went through the fused ops"
    assert abs(float(out.array) - float(ref.array)) < 1e-5
    for got, t in zip(fused, (x, w, b)):
        np.testing.assert_allclose(got, cp.asnumpy(t.grad.array), rtol=1e-4, atol=1e-5)


def _spy_on_fused_ops(monkeypatch):
    """{name: calls} of the fused tensor ops, which keep working; F looks them up per call."""
    calls = {}
    for name in ("fused_bias_gelu", "fused_cross_entropy", "fused_layer_norm"):
        calls[name] = []
        monkeypatch.setattr(fused_kernels, name, _spy(getattr(fused_kernels, name), calls[name]))
    return calls


def _spy(op, calls):
    def spy(*args, **kwargs):
        calls.append(args)
        return op(*args, **kwargs)
    return spy


def _functional_fused_and_not(monkeypatch, fn, leaves, op):
    """(output, grads) of ``fn`` with the fused kernels on, then off; checks that F used the
    fused ``op`` exactly when they were on. A float64 weight makes the upstream gradient
    float64, which the kernels must accept."""
    spies = _spy_on_fused_ops(monkeypatch)
    results = []
    for switch in ("1", "0"):
        monkeypatch.setenv(ENV_FUSED_KERNELS, switch)
        for t in leaves:
            t.grad = None
        out = fn()
        weights = np.linspace(-1.0, 1.0, out.array.size).reshape(out.array.shape)
        (out * Tensor(weights, device="cuda")).sum().backward()
        assert out.array.dtype == cp.float32
        results.append((cp.asnumpy(out.array), [cp.asnumpy(t.grad.array) for t in leaves]))
        assert len(spies[op]) == 1, f"{op} ran {len(spies[op])} times with the switch at {switch}"
    return results


def _assert_agree(results, rtol=1e-4, atol=1e-5):
    (fused_out, fused_grads), (plain_out, plain_grads) = results
    np.testing.assert_allclose(fused_out, plain_out, rtol=rtol, atol=atol)
    for got, expected in zip(fused_grads, plain_grads):
        assert got.dtype == expected.dtype == np.float32
        np.testing.assert_allclose(got, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_functional_gelu_runs_the_kernel_on_cuda(monkeypatch, approximate):
    x = Tensor(_data((4, 16, 96), 18, 3.0), device="cuda", requires_grad=True)
    _assert_agree(_functional_fused_and_not(
        monkeypatch, lambda: F.gelu(x, approximate=approximate), [x], "fused_bias_gelu"))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_functional_cross_entropy_runs_the_kernel_on_cuda(monkeypatch, reduction, smoothing):
    z = Tensor(_data((64, 1000), 19, 4.0), device="cuda", requires_grad=True)
    target = np.random.default_rng(20).integers(0, 1000, 64)
    target[::5] = 7
    _assert_agree(_functional_fused_and_not(
        monkeypatch, lambda: F.cross_entropy(z, cp.asarray(target), reduction=reduction,
                                             ignore_index=7, label_smoothing=smoothing),
        [z], "fused_cross_entropy"))


@pytest.mark.parametrize("affine", [(True, True), (True, False), (False, False)])
def test_functional_layer_norm_runs_the_kernel_on_cuda(monkeypatch, affine):
    x = Tensor(_data((4, 30, 768), 21, 3.0, 2.0), device="cuda", requires_grad=True)
    w, b = (Tensor(_data(768, seed), device="cuda", requires_grad=True) if on else None
            for on, seed in zip(affine, (22, 23)))
    leaves = [t for t in (x, w, b) if t is not None]
    _assert_agree(_functional_fused_and_not(
        monkeypatch, lambda: F.layer_norm(x, 768, w, b, eps=1e-6), leaves, "fused_layer_norm"),
        atol=1e-4)


def test_functional_falls_back_where_the_kernels_do_not_apply(monkeypatch):
    spies = _spy_on_fused_ops(monkeypatch)
    x64 = Tensor(_data((4, 8), 24).astype(np.float64), device="cuda")
    F.gelu(x64), F.layer_norm(x64, 8), F.cross_entropy(x64, cp.arange(4))
    x3 = Tensor(_data((2, 3, 8), 25), device="cuda")
    assert F.layer_norm(x3, (3, 8)).array.shape == (2, 3, 8)
    logits = Tensor(_data((4, 8), 26), device="cuda")
    F.cross_entropy(logits, cp.full((4, 8), 1.0 / 8, cp.float32))  # probability targets
    F.cross_entropy(Tensor(_data((2, 8, 3), 27), device="cuda"), cp.zeros((2, 3), cp.int64))
    assert not any(spies.values())


def test_fused_adamw_matches_adamw_on_cuda():
    shapes = [(50, 20), (20,), (7, 3)]
    fused = [Tensor(_data(s, i), device="cuda", requires_grad=True) for i, s in enumerate(shapes)]
    plain = [Tensor(_data(s, i), device="cuda", requires_grad=True) for i, s in enumerate(shapes)]
    opt_fused = FusedAdamW(fused, lr=1e-2, weight_decay=0.1)
    opt_plain = AdamW(plain, lr=1e-2, weight_decay=0.1)
    for step in range(3):
        for i, (a, b) in enumerate(zip(fused, plain)):
            g = cp.asarray(_data(shapes[i], 50 + 10 * step + i))
            a.grad, b.grad = g.copy(), g.copy()
        opt_fused.step()
        opt_plain.step()
    for a, b in zip(fused, plain):
        np.testing.assert_allclose(cp.asnumpy(a.array), cp.asnumpy(b.array), rtol=1e-5, atol=1e-6)
    assert opt_fused.state[fused[0]]["step"] == 3


def test_gpt_trains_on_the_gpu_with_token_ids_on_either_side():
    from neural_arch.core import manual_seed
    from neural_arch.models import GPT
    from neural_arch.models.gpt import GPTConfig
    config = GPTConfig(block_size=16, vocab_size=50, n_layer=1, n_head=2, n_embd=32)
    tokens = np.random.default_rng(3).integers(0, 50, (2, 16))
    losses = {}
    for device, ids in (("cpu", tokens), ("cuda", tokens),
                        ("cuda-ids", Tensor(tokens, device="cuda"))):
        manual_seed(0)
        model = GPT(config).to("cpu" if device == "cpu" else "cuda")
        _, loss = model(ids, ids)
        loss.backward()
        losses[device] = float(loss.item())
        assert all(p.grad is not None for p in model.parameters())
    assert losses["cuda"] == losses["cuda-ids"]
    assert losses["cuda"] == pytest.approx(losses["cpu"], rel=1e-5)
