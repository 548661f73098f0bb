"""Numba CPU kernels against NumPy: both forms of every kernel, with Numba and without.

Each public function is run with its Numba form forced on (size limit lifted) and forced off
(the compiled kernel replaced by None, as when Numba is absent), and compared with an
independent NumPy computation: bit for bit where the math is the same, within float tolerance
for the cross-entropy sums. A subprocess checks the whole module with Numba switched off.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.backends import numba_backend
from neural_arch.backends import numba_kernels as nk
from neural_arch.core import Tensor
from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(120)
needs_numba = pytest.mark.skipif(not numba_backend.is_available(),
                                 reason=f"Numba not usable: {numba_backend.unavailable_reason()}")
FORMS = [pytest.param("numba", marks=needs_numba), "numpy"]


@pytest.fixture
def form(request, monkeypatch):
    """Force every public function onto one form for the test."""
    for name in nk.NUMBA_LIMITS:
        if request.param == "numba":
            monkeypatch.setitem(nk.NUMBA_LIMITS, name, None)
        else:
            monkeypatch.setitem(nk._KERNELS, name, None)
    for name in nk.NUMBA_LIMITS:
        assert nk.form_in_use(name, 10 ** 9) == request.param
    return request.param


@pytest.mark.parametrize("form", FORMS, indirect=True)
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int32, np.int64, np.float16])
@pytest.mark.parametrize("p,n", [(2, 1), (3, 1000), (4, 4096 * 2 + 5), (8, 37)])
def test_reduce_sum_into_is_bit_identical_to_the_add_chain(form, dtype, p, n):
    rng = np.random.default_rng(p * n)
    slots = [(rng.standard_normal(n) * 1e3).astype(dtype) for _ in range(p)]
    expected = slots[0] + slots[1]
    for s in slots[2:]:
        expected = expected + s
    out = np.empty(n, dtype)
    assert nk.reduce_sum_into(out, slots) is out
    np.testing.assert_array_equal(out, expected)


def test_reduce_sum_into_rejects_mismatched_slots():
    out = np.zeros(4, np.float32)
    with pytest.raises(ValueError, match="at least 2 slots"):
        nk.reduce_sum_into(out, [out])
    with pytest.raises(ValueError, match=r"slot 1 has shape \(5,\)"):
        nk.reduce_sum_into(out, [np.zeros(4, np.float32), np.zeros(5, np.float32)])
    with pytest.raises(ValueError, match="slot 0 has shape .* dtype float64"):
        nk.reduce_sum_into(out, [np.zeros(4), np.zeros(4)])


def _special_floats() -> np.ndarray:
    """Values at every float16 boundary: zeros, subnormals, rounding ties, overflow, NaNs."""
    tiny = np.float32(2.0 ** -24)  # smallest float16 subnormal
    values = [0.0, -0.0, 1.0, -1.0, 65504.0, 65519.99, 65520.0, -65520.0, 1e5, np.inf, -np.inf,
              tiny, tiny / 2, tiny * 0.5000001, tiny * 1.5, tiny * 2.5, 6.097555e-5, 6.1035156e-5,
              2.0 ** -14 * (1 + 2.0 ** -11), 2.0 ** -14 * (1 + 3 * 2.0 ** -11), 1e-10, 3e-8,
              1.0 + 2.0 ** -11, 1.0 + 3 * 2.0 ** -11, 2049.0, 2051.0, 0.1, 1 / 3]
    bits = np.array([0x7F800001, 0xFF800001, 0x7FC00000, 0x7F802000, 0x7FFFFFFF],
                    dtype=np.uint32).view(np.float32)
    return np.concatenate([np.array(values, dtype=np.float32), bits])


def _assert_same_half(got: np.ndarray, expected: np.ndarray) -> None:
    nan = np.isnan(expected)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], expected.view(np.uint16)[~nan])


@pytest.mark.parametrize("form", FORMS, indirect=True)
def test_cast_to_float16_matches_numpy_on_special_values_and_random_bits(form):
    rng = np.random.default_rng(7)
    random_bits = rng.integers(0, 2 ** 32, 1 << 18, dtype=np.uint64).astype(np.uint32)
    for src in (_special_floats(), random_bits.view(np.float32),
                (rng.standard_normal((64, 33)) * 100).astype(np.float32)):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # overflow to inf is the point
            expected = src.astype(np.float16)
        _assert_same_half(nk.cast_to_float16(src), expected)
        out = np.empty(src.shape, np.float16)
        assert nk.cast_to_float16(src, out) is out
        _assert_same_half(out, expected)


def test_cast_to_float16_rejects_bad_arguments():
    with pytest.raises(TypeError, match="takes float32, got float64"):
        nk.cast_to_float16(np.zeros(3))
    with pytest.raises(ValueError, match=r"out has shape \(4,\) and dtype float16"):
        nk.cast_to_float16(np.zeros(3, np.float32), np.zeros(4, np.float16))


def _topk_by_sorting(grad: np.ndarray, k: int):
    # Stable sort on -|g| keeps lower indices first among equal magnitudes.
    order = np.argsort(-np.abs(grad.astype(np.float64)), kind="stable")[:k]
    indices = np.sort(order)
    return indices, grad[indices]


@pytest.mark.parametrize("form", FORMS, indirect=True)
@pytest.mark.parametrize("n,k", [(1, 1), (10, 0), (10, 10), (1000, 10), (5000, 4999)])
def test_topk_compress_matches_a_full_sort(form, n, k):
    rng = np.random.default_rng(n + k)
    grad = rng.standard_normal(n).astype(np.float32)
    grad[n // 2:] = np.round(grad[n // 2:], 1)  # many exact ties in magnitude
    indices, values = nk.topk_compress(grad, k)
    expected_indices, expected_values = _topk_by_sorting(grad, k)
    assert indices.dtype == np.int64 and values.dtype == grad.dtype
    np.testing.assert_array_equal(indices, expected_indices)
    np.testing.assert_array_equal(values, expected_values)
    dense = nk.topk_decompress(indices, values, n)
    kept = np.zeros(n, bool)
    kept[expected_indices] = True
    np.testing.assert_array_equal(dense, np.where(kept, grad, 0))


@pytest.mark.parametrize("form", FORMS, indirect=True)
def test_topk_ties_go_to_the_lower_index_and_nan_is_refused(form):
    indices, values = nk.topk_compress(np.array([1.0, -3.0, 3.0, 2.0, -3.0]), 2)
    np.testing.assert_array_equal(indices, [1, 2])
    np.testing.assert_array_equal(values, [-3.0, 3.0])
    with pytest.raises(ValueError, match="holds NaN"):
        nk.topk_compress(np.array([1.0, np.nan, 0.5]), 2)
    with pytest.raises(ValueError, match=r"k must be an integer in \[0, 3\], got 4"):
        nk.topk_compress(np.zeros(3), 4)
    with pytest.raises(ValueError, match="1-D floating array"):
        nk.topk_compress(np.zeros((2, 2)), 1)


@pytest.mark.parametrize("form", FORMS, indirect=True)
@pytest.mark.parametrize("rows,classes", [(1, 1), (16, 10), (33, 300)])
def test_softmax_cross_entropy_matches_autograd(form, rows, classes):
    rng = np.random.default_rng(rows * classes)
    logits = (rng.standard_normal((rows, classes)) * 5).astype(np.float32)
    target = rng.integers(0, classes, rows)
    target[1::4] = -100
    loss, grad = nk.softmax_cross_entropy(logits, target)
    z = Tensor(logits.copy(), requires_grad=True)
    expected = F.cross_entropy(z, target)
    expected.backward()
    assert grad.dtype == np.float32
    assert loss == pytest.approx(float(expected.array), rel=1e-5, abs=1e-6)
    np.testing.assert_allclose(grad, z.grad, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("form", FORMS, indirect=True)
def test_softmax_cross_entropy_edge_cases(form):
    loss, grad = nk.softmax_cross_entropy(np.zeros((2, 3), np.float32), np.array([-100, -100]))
    assert np.isnan(loss) and not grad.any()
    loss, _ = nk.softmax_cross_entropy(np.array([[1e4, 0, -1e4]], np.float32), np.array([0]))
    assert loss == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError, match="target value 3 is out of range for 3 classes"):
        nk.softmax_cross_entropy(np.zeros((1, 3), np.float32), np.array([3]))


def test_limits_pick_the_form_by_size(monkeypatch):
    monkeypatch.setitem(nk.NUMBA_LIMITS, "reduce_sum", 100)
    expected = "numba" if numba_backend.is_available() else "numpy"
    assert nk.form_in_use("reduce_sum", 100) == expected
    assert nk.form_in_use("reduce_sum", 101) == "numpy"
    monkeypatch.setitem(nk.NUMBA_LIMITS, "topk", 0)
    assert nk.form_in_use("topk", 1) == "numpy"
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        nk.form_in_use("nope", 1)


_WITHOUT_NUMBA = """
import json, numpy as np
from neural_arch.backends import numba_backend, numba_kernels as nk
slots = [np.arange(5, dtype=np.float32), np.ones(5, np.float32)]
out = nk.reduce_sum_into(np.empty(5, np.float32), slots)
print(json.dumps({"available": numba_backend.is_available(),
                  "reason": numba_backend.unavailable_reason(),
                  "forms": sorted({nk.form_in_use(k, 1) for k in nk.NUMBA_LIMITS}),
                  "kernels": [v is None for v in nk._KERNELS.values()],
                  "sum": out.tolist(),
                  "half": nk.cast_to_float16(np.array([1.5], np.float32)).tolist()}))
"""


def test_everything_falls_back_to_numpy_when_numba_is_switched_off():
    env = dict(os.environ, NEURAL_ARCH_NUMBA="0")
    result = subprocess.run([sys.executable, "-c", _WITHOUT_NUMBA], env=env, cwd=REPO_ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["available"] is False and "NEURAL_ARCH_NUMBA=0" in report["reason"]
    assert report["forms"] == ["numpy"] and all(report["kernels"])
    assert report["sum"] == [1.0, 2.0, 3.0, 4.0, 5.0] and report["half"] == [1.5]
