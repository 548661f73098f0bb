"""The reduction loops of ``reductions.kernels``: float16 sums accumulated in float32 and rounded
once, the casts, and the two-rank mean, in their compiled and NumPy forms, against NumPy
references computed the documented way."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.backends import numba_backend
from neural_arch.distributed.reductions import kernels as rk

pytestmark = pytest.mark.timeout(120)

FORMS = ["compiled", "numpy"]


@pytest.fixture(params=FORMS)
def form(request, monkeypatch):
    """Run a test with the Numba form (skipped without Numba) or with NumPy's."""
    if request.param == "numpy":
        monkeypatch.setattr(rk, "kernels", lambda: None)
    elif rk.kernels() is None:
        pytest.skip(f"no compiled reductions: {rk.why_not_compiled()}")
    return request.param


def halves(count: int, n: int, seed: int = 0) -> list:
    """Float16 vectors over many magnitudes, with infinities, NaN, subnormals and the largest
    finite value among them."""
    rng = np.random.default_rng(seed)
    out = []
    for k in range(count):
        v = rng.standard_normal(n) * 10.0 ** rng.integers(-7, 5, n)
        v[k:k + 8] = [65504, -65504, 6e-8, np.inf, 0.0, -0.0, 1e-5, 2049][:len(v[k:k + 8])]
        out.append(v.astype(np.float16))
    return out


def float32_reference(operands: list, divisor: int = 0) -> np.ndarray:
    """The documented float16 reduction: a float32 sum in operand order, divided in float32,
    rounded once."""
    acc = operands[0].astype(np.float32)
    for x in operands[1:]:
        acc = acc + x.astype(np.float32)
    if divisor:
        acc = acc / np.float32(divisor)
    with np.errstate(over="ignore"):
        return acc.astype(np.float16)


@pytest.mark.parametrize("count,divisor", [(1, 3), (2, 0), (2, 2), (3, 0), (3, 3), (4, 4),
                                           (5, 0)])
def test_float16_sum_is_a_float32_sum_rounded_once(form, count, divisor):
    ops = halves(count, 10_007)
    out = np.empty_like(ops[0])
    with np.errstate(invalid="ignore"):
        rk.sum_halves(out, ops, divisor)
        want = float32_reference(ops, divisor)
    np.testing.assert_array_equal(out.view(np.uint16)[~np.isnan(want)],
                                  want.view(np.uint16)[~np.isnan(want)])
    assert np.isnan(out[np.isnan(want)]).all()
    assert rk.form_in_use(out.size) == form


def test_float16_mean_of_two_maxima_is_finite_and_sums_past_the_range_overflow(form):
    big = np.full(2048, 65504, np.float16)
    mean, total = np.empty_like(big), np.empty_like(big)
    rk.sum_halves(mean, (big, big), 2)
    rk.sum_halves(total, (big, big))
    assert (mean == 65504).all() and np.isposinf(total).all()


@pytest.mark.parametrize("divisor", [0, 2, 3])
def test_float16_sum_in_place_of_either_operand(form, divisor):
    x, y = halves(2, 5000, seed=3)
    with np.errstate(invalid="ignore"):
        want = float32_reference([x, y], divisor)
    a, b = x.copy(), y.copy()
    rk.sum_halves(a, (a, y), divisor)
    rk.sum_halves(b, (x, b), divisor)
    np.testing.assert_array_equal(a, want)
    np.testing.assert_array_equal(b, want)


def test_two_operands_rounded_once_are_numpys_float16_add(form):
    """Every float16 against a spread of others: the pairwise sum the ring and recursive
    doubling make keeps NumPy's float16 bits."""
    every = np.arange(1 << 16, dtype=np.uint16).view(np.float16)
    out = np.empty_like(every)
    for k in range(0, 1 << 16, 997):
        column = np.full(every.size, every[k])
        rk.add_halves(column, every, out)
        with np.errstate(all="ignore"):
            want = column + every
        same = (out.view(np.uint16) == want.view(np.uint16)) | (np.isnan(out) & np.isnan(want))
        assert same.all(), (k, np.flatnonzero(~same)[:5])


def test_float16_divide_matches_numpy(form):
    x = halves(1, 4096, seed=5)[0]
    for count in (2, 3, 4, 7):
        out = np.empty_like(x)
        rk.divide_halves(x, count, out)
        with np.errstate(all="ignore"):
            want = np.divide(x, np.float16(count))
        np.testing.assert_array_equal(out, want)


def test_casts_match_numpy_on_random_bit_patterns(form):
    bits = np.random.default_rng(7).integers(0, 1 << 32, 1 << 15, dtype=np.uint64)
    src = bits.astype(np.uint32).view(np.float32)
    with np.errstate(all="ignore"):
        want = src.astype(np.float16)
    got = rk.to_float16(src)
    finite = ~np.isnan(want)
    np.testing.assert_array_equal(got.view(np.uint16)[finite], want.view(np.uint16)[finite])
    assert np.isnan(got[~finite]).all()
    back = rk.to_float32(got, np.empty(got.shape, np.float32))
    np.testing.assert_array_equal(back[finite], got.astype(np.float32)[finite])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pair_mean_is_the_sum_then_the_product_in_order(form, dtype):
    rng = np.random.default_rng(11)
    with np.errstate(over="ignore"):
        x = (rng.standard_normal(4099) * 10.0 ** rng.integers(-40, 38, 4099)).astype(dtype)
    y = np.roll(x, 5)
    x[:3] = np.finfo(dtype).tiny * np.array([1.5, 3.0, -0.75], dtype)  # halves round
    bits = {np.float32: np.uint32, np.float64: np.uint64}[dtype]
    quiet = 0x7FC00000 if dtype is np.float32 else 0x7FF8000000000000
    x.view(bits)[10:12] = [quiet + 1, quiet + 2]
    y[10:12] = x[11:9:-1]  # NaNs with other payloads: the first operand's is kept
    for acc_first in (True, False):
        with np.errstate(all="ignore"):
            want = ((x + y) if acc_first else (y + x)) * dtype(0.5)
        got = x.copy()
        rk.pair_mean(got, y, 0.5, acc_first)
        np.testing.assert_array_equal(got.view(bits), want.view(bits))


def test_float16_pair_mean_is_the_rounded_sum_then_the_rounded_half(form):
    """The bits of a ring's finished piece (``add_halves``, then ``divide_halves`` by two:
    two roundings) in one pass: a sum past 65504 is inf before it is halved, and subnormal
    halves round."""
    x, y = halves(2, 4099, seed=5)
    x[20:23], y[20:23] = [60000, -60000, 1.2e-7], [60000, -60000, 0]
    x.view(np.uint16)[30:32] = [0x7E01, 0x7E02]
    y[30:32] = x[31:29:-1]
    for acc_first in (True, False):
        want = np.empty_like(x)
        rk.add_halves(*((x, y) if acc_first else (y, x)), want)
        rk.divide_halves(want, 2, want)
        got = x.copy()
        rk.pair_mean_half(got, y, 0.5, acc_first)
        # Two NaNs: which payload survives is the compiler's choice (LLVM may commute a float
        # add). On one AMD EPYC the compiled add_halves of the reference kept the second
        # operand's payload where pair_mean_half and NumPy keep the first, so those two only
        # have to stay NaN here.
        assert np.isnan(got[30:32]).all() and np.isnan(want[30:32]).all()
        got[30:32] = want[30:32] = 0
        np.testing.assert_array_equal(got.view(np.uint16), want.view(np.uint16))
    assert np.isinf(got[20]) and got[22] == np.float16(6e-8)


def test_bad_operands_are_named():
    with pytest.raises(TypeError, match=r"operands\[1\] has dtype float32"):
        rk.sum_halves(np.zeros(3, np.float16), (np.zeros(3, np.float16), np.zeros(3, np.float32)))
    with pytest.raises(ValueError, match="at least one operand"):
        rk.sum_halves(np.zeros(3, np.float16), ())


def test_switched_off_numba_runs_numpy(monkeypatch):
    assert rk.ENV_SWITCH == numba_backend.ENV_SWITCH  # one switch for every Numba kernel
    monkeypatch.setenv(rk.ENV_SWITCH, "0")
    assert rk.form_in_use(1 << 20) == "numpy"
    assert "NEURAL_ARCH_NUMBA=0" in rk.why_not_compiled()
    out = np.empty(1 << 12, np.float16)
    ops = halves(3, out.size)
    rk.sum_halves(out, ops, 3)
    np.testing.assert_array_equal(out, float32_reference(ops, 3))
