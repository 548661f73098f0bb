"""The mean of a sum: a power-of-two count multiplies by the reciprocal, with a division's bits."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.reduce_ops import ReduceOp, averager, divide_by_count, finish_average

FLOATS = (np.float16, np.float32, np.float64)


def awkward_values(dtype) -> np.ndarray:
    """Random magnitudes over the whole range, subnormals, zeros of both signs, infinities and
    NaNs with payloads."""
    info = np.finfo(dtype)
    rng = np.random.default_rng(np.dtype(dtype).num)
    exponents = rng.uniform(np.log2(float(info.smallest_subnormal)), np.log2(float(info.max)),
                            20_000)
    values = (np.exp2(exponents) * rng.choice([-1.0, 1.0], exponents.size)).astype(dtype)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, float(info.smallest_subnormal),
                         float(info.tiny), -float(info.tiny), float(info.max)], dtype=dtype)
    values = np.concatenate([values, specials])
    bits = values.view(f"u{values.itemsize}")
    bits[-5:-4] |= 1  # a NaN payload to carry through
    return values


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("count", [1, 2, 3, 4, 5, 6, 7, 8, 16, 1024])
def test_mean_has_the_bits_of_a_division(dtype, count):
    values = awkward_values(dtype)
    expected = np.divide(values, np.dtype(dtype).type(count))
    got = values.copy()
    divide_by_count(got, count)
    assert np.array_equal(got.view(f"u{got.itemsize}"), expected.view(f"u{got.itemsize}"))
    out = np.empty_like(values)
    divide_by_count(values, count, out=out)
    assert np.array_equal(out.view(f"u{out.itemsize}"), expected.view(f"u{out.itemsize}"))


@pytest.mark.parametrize("dtype", FLOATS)
def test_power_of_two_counts_multiply_and_others_divide(dtype):
    for count in (1, 2, 4, 8, 64):
        ufunc, scalar = averager(np.dtype(dtype), count)
        assert ufunc is np.multiply and scalar == 1.0 / count and type(scalar) is dtype
    for count in (3, 5, 6, 12):
        ufunc, scalar = averager(np.dtype(dtype), count)
        assert ufunc is np.divide and scalar == count and type(scalar) is dtype


def test_finish_average_only_touches_averages():
    buf = np.array([6.0, -3.0, 1.0], np.float32)
    finish_average(buf, ReduceOp.SUM, 4)
    assert buf.tolist() == [6.0, -3.0, 1.0]
    finish_average(buf, ReduceOp.AVERAGE, 4)
    assert buf.tolist() == [1.5, -0.75, 0.25]
