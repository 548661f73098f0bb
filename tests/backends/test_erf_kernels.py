"""Erf and exact GELU of the NumPy backend: the compiled kernels and the NumPy forms, each
against float64 references built from ``math.erf`` / ``math.erfc``."""
from __future__ import annotations

import math

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch.backends import erf_kernels, numpy_backend, special
from neural_arch.core import Tensor

ERF = np.vectorize(math.erf, otypes=[np.float64])
ERFC = np.vectorize(math.erfc, otypes=[np.float64])

KERNELS = pytest.param("kernels", marks=pytest.mark.skipif(
    not erf_kernels.available(), reason="Numba is not installed or is switched off"))
FORMS = [KERNELS, "numpy"]
# max relative error of erf (special's fits, 2e-7 and 5e-15, plus rounding)
ERF_RTOL = {np.float32: 3e-7, np.float64: 1e-14}


def forms(which: str):
    """(erf, gelu) of the kernels or of the NumPy fallback."""
    if which == "kernels":
        return erf_kernels.erf, erf_kernels.gelu
    return numpy_backend.numpy_forms()


def grid(dtype) -> np.ndarray:
    values = np.concatenate([np.linspace(-9, 9, 4001), np.geomspace(1e-30, 6, 300),
                             -np.geomspace(1e-30, 6, 300)])
    return values.astype(dtype)


def gelu_reference(x: np.ndarray):
    """x * Phi(x) and Phi(x) + x phi(x) in float64 (erfc keeps Phi accurate for x << 0)."""
    v = x.astype(np.float64)
    cdf = 0.5 * ERFC(-v / math.sqrt(2.0))
    return v * cdf, cdf + v * np.exp(-0.5 * v * v) / math.sqrt(2.0 * math.pi)


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_erf_matches_math_erf(which, dtype):
    erf, _ = forms(which)
    x = grid(dtype)
    result = erf(x)
    assert result.dtype == dtype and result.shape == x.shape
    reference = ERF(x.astype(np.float64))
    assert np.all(result[x == 0] == 0)
    error = np.abs(result - reference)[x != 0] / np.abs(reference[x != 0])
    assert error.max() < ERF_RTOL[dtype], f"worst at x={x[np.argmax(error)]}: {error.max()}"


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gelu_and_derivative_match_reference(which, dtype):
    _, gelu = forms(which)
    x = grid(dtype)
    out, derivative = gelu(x, True)
    assert out.dtype == dtype and derivative.dtype == dtype
    ref_out, ref_derivative = gelu_reference(x)
    # erf(x / sqrt 2) is relative-accurate, so Phi = (1 + erf) / 2 is accurate to ERF_RTOL
    # absolutely: GELU to ERF_RTOL * max(|x|, 1), its derivative to a few ERF_RTOL
    tol = 2 * ERF_RTOL[dtype]
    scale = np.maximum(np.abs(x.astype(np.float64)), 1.0)
    assert np.all(np.abs(out - ref_out) <= tol * scale)
    assert np.all(np.abs(derivative - ref_derivative) <= tol * scale)
    forward_only, none = gelu(x, False)
    assert none is None
    np.testing.assert_array_equal(forward_only, out)


@pytest.mark.parametrize("which", FORMS)
def test_gelu_derivative_matches_finite_differences(which):
    _, gelu = forms(which)
    x = np.linspace(-6, 6, 241)
    h = 1e-6
    numeric = (gelu(x + h, False)[0] - gelu(x - h, False)[0]) / (2 * h)
    np.testing.assert_allclose(gelu(x, True)[1], numeric, atol=1e-8)


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_special_values(which, dtype):
    erf, gelu = forms(which)
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, 40.0, -40.0], dtype=dtype)
    result = erf(x)
    np.testing.assert_array_equal(result[[0, 1, 2, 3, 5, 6]], [0.0, -0.0, 1.0, -1.0, 1.0, -1.0])
    assert np.signbit(result[1]) and np.isnan(result[4])
    with np.errstate(invalid="ignore"):  # inf * 0 in the NumPy form is the NaN expected
        out, derivative = gelu(x, True)
        fallback_out, fallback_derivative = special.gelu(x, np, True)
    # the kernels follow the NumPy formula, including its NaN for -inf and its inf * 0 at +inf
    np.testing.assert_array_equal(out, fallback_out)
    np.testing.assert_array_equal(derivative, fallback_derivative)
    np.testing.assert_array_equal(out[[0, 2, 5, 6]], [0.0, np.inf, 40.0, 0.0])
    np.testing.assert_array_equal(derivative[[0, 5, 6]], [0.5, 1.0, 0.0])


@pytest.mark.parametrize("which", FORMS)
def test_shapes_layouts_and_dtypes(which):
    erf, gelu = forms(which)
    empty = np.zeros((0, 3), np.float32)
    assert erf(empty).shape == (0, 3) and erf(empty).dtype == np.float32
    out, derivative = gelu(empty, True)
    assert out.shape == derivative.shape == (0, 3)
    scalar = np.array(0.5)
    assert erf(scalar).shape == () and np.isclose(erf(scalar), math.erf(0.5), rtol=1e-15)
    base = np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32) * 3
    strided = base[::2, ::-3]  # not contiguous, negative strides
    assert not strided.flags.c_contiguous
    np.testing.assert_array_equal(erf(strided), erf(np.ascontiguousarray(strided)))
    np.testing.assert_array_equal(gelu(strided, True)[1],
                                  gelu(np.ascontiguousarray(strided), True)[1])
    half = base.astype(np.float16)  # computed in float32, returned in float16
    assert erf(half).dtype == np.float16 and gelu(half, True)[1].dtype == np.float16
    np.testing.assert_allclose(erf(half), ERF(half.astype(np.float64)), rtol=1e-3, atol=1e-3)
    with pytest.raises(TypeError, match="int64"):
        erf(np.arange(3))


def test_float32_exp_of_the_kernels():
    """The vectorisable exp of the float32 kernels: within 2 ulp of exp down to ln(FLT_MIN),
    0 below it, NaN for NaN."""
    if not erf_kernels.available():
        pytest.skip("Numba is not installed or is switched off")
    y = np.concatenate([-np.geomspace(1e-8, 87.3, 1500), np.linspace(-87.3, 0, 1500)])
    y = y.astype(np.float32)
    result = np.array([erf_kernels._exp32(v) for v in y], dtype=np.float32)
    reference = np.exp(y.astype(np.float64))
    ulp = np.spacing(reference.astype(np.float32)).astype(np.float64)
    assert np.max(np.abs(result - reference) / ulp) <= 2
    edges = np.array([0.0, -0.0, -87.5, -200.0, -np.inf, np.nan], dtype=np.float32)
    result = [erf_kernels._exp32(v) for v in edges]
    assert result[:5] == [1.0, 1.0, 0.0, 0.0, 0.0] and np.isnan(result[5])


def test_kernels_agree_with_numpy_forms():
    if not erf_kernels.available():
        pytest.skip("Numba is not installed or is switched off")
    x = np.random.default_rng(1).standard_normal(10_000) * 4
    for dtype in (np.float32, np.float64):
        v = x.astype(dtype)
        tol = 4 * float(np.finfo(dtype).eps)
        np.testing.assert_allclose(erf_kernels.erf(v), special.erf(v, np), rtol=tol, atol=tol)
        for got, want in zip(erf_kernels.gelu(v, True), special.gelu(v, np, True)):
            np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


@pytest.mark.parametrize("which", FORMS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tensor_gelu_runs_the_selected_form(monkeypatch, which, dtype):
    """F.gelu and F.erf go through whichever form the backend selected."""
    monkeypatch.setattr(numpy_backend, "_forms", forms(which))
    x = np.random.default_rng(2).standard_normal((4, 5)).astype(dtype)
    t = Tensor(x, requires_grad=True)
    y = F.gelu(t)
    y.backward(np.ones_like(x))
    ref_out, ref_derivative = gelu_reference(x)
    tol = 4 * ERF_RTOL[dtype]
    assert y.array.dtype == dtype and t.grad.dtype == dtype
    np.testing.assert_allclose(y.array, ref_out, rtol=tol, atol=tol)
    np.testing.assert_allclose(t.grad, ref_derivative, rtol=tol, atol=tol)
    np.testing.assert_allclose(F.erf(Tensor(x)).array, ERF(x.astype(np.float64)), rtol=tol)
    assert not F.gelu(Tensor(x)).requires_grad  # no derivative computed or kept


def test_numpy_forms_are_selected_when_numba_is_switched_off():
    import os
    import subprocess
    import sys
    code = ("import numpy as np\n"
            "from neural_arch.backends import erf_kernels, numpy_backend\n"
            "assert not erf_kernels.available()\n"
            "x = np.linspace(-3, 3, 7, dtype=np.float32)\n"
            "assert numpy_backend.erf(x).dtype == np.float32\n"
            "assert numpy_backend._forms[0] is not erf_kernels.erf\n")
    env = dict(os.environ, NEURAL_ARCH_NUMBA="0")
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr
