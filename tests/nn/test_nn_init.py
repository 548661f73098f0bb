"""Initialisers: ranges and moments from PyTorch's formulas, reproducibility, fan computation."""
import math

import numpy as np
import pytest

from neural_arch.core import Tensor, manual_seed
from neural_arch.nn import Parameter, init

pytestmark = pytest.mark.timeout(30)


def _param(*shape):
    return Parameter(np.empty(shape, dtype=np.float32))


def test_fans_and_gains():
    assert init.calculate_fan_in_and_fan_out(_param(30, 20)) == (20, 30)
    assert init.calculate_fan_in_and_fan_out(np.empty((8, 4, 3, 3))) == (36, 72)
    with pytest.raises(ValueError, match=r"\(5,\)"):
        init.calculate_fan_in_and_fan_out(_param(5))
    assert init.calculate_gain("relu") == pytest.approx(math.sqrt(2))
    assert init.calculate_gain("leaky_relu", math.sqrt(5)) == pytest.approx(math.sqrt(1 / 3))
    assert init.calculate_gain("tanh") == pytest.approx(5 / 3)


def test_uniform_and_normal_moments():
    p = _param(400, 500)
    init.uniform_(p, -2.0, 3.0)
    assert p.array.min() >= -2.0 and p.array.max() <= 3.0
    assert p.array.mean() == pytest.approx(0.5, abs=0.01)
    assert p.array.std() == pytest.approx(5 / math.sqrt(12), rel=0.01)
    init.normal_(p, 1.5, 0.5)
    assert p.array.mean() == pytest.approx(1.5, abs=0.005)
    assert p.array.std() == pytest.approx(0.5, rel=0.01)
    assert p.dtype == np.float32


def test_constant_fills():
    p = _param(3, 2)
    assert init.zeros_(p) is p and not p.array.any()
    init.ones_(p)
    assert np.all(p.array == 1)
    init.constant_(p, 0.25)
    assert np.all(p.array == 0.25)
    raw = np.empty((2, 2))
    init.ones_(raw)
    assert np.all(raw == 1)


def test_xavier_and_kaiming_bounds():
    p = _param(300, 200)
    init.xavier_uniform_(p, gain=2.0)
    bound = 2.0 * math.sqrt(6 / 500)
    assert np.abs(p.array).max() <= bound
    assert p.array.std() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    init.kaiming_uniform_(p, a=math.sqrt(5))
    assert np.abs(p.array).max() <= 1 / math.sqrt(200)
    assert p.array.std() == pytest.approx(1 / math.sqrt(200) / math.sqrt(3), rel=0.02)
    init.kaiming_uniform_(p, mode="fan_out", nonlinearity="relu")
    bound = math.sqrt(2) * math.sqrt(3 / 300)
    assert np.abs(p.array).max() <= bound
    assert p.array.std() == pytest.approx(bound / math.sqrt(3), rel=0.02)
    with pytest.raises(ValueError, match="fan_mid"):
        init.kaiming_uniform_(p, mode="fan_mid")


def test_reproducible_with_manual_seed_and_generator():
    a, b = _param(4, 4), _param(4, 4)
    manual_seed(7)
    init.normal_(a)
    manual_seed(7)
    init.normal_(b)
    np.testing.assert_array_equal(a.array, b.array)
    init.uniform_(a, generator=np.random.default_rng(1))
    init.uniform_(b, generator=np.random.default_rng(1))
    np.testing.assert_array_equal(a.array, b.array)
    assert isinstance(a, Tensor)


def test_affine_default_is_the_linear_and_conv_init():
    """One helper serves Linear and Conv: the same draws as kaiming_uniform_(a=sqrt(5)) then
    U(-1/sqrt(fan_in), ...) for the bias, fan_in counting the kernel and the groups."""
    from neural_arch import nn
    for make, shape in ((lambda: nn.Linear(6, 4), ((4, 6), (4,))),
                        (lambda: nn.Conv2d(6, 4, (3, 2), groups=2), ((4, 3, 3, 2), (4,)))):
        manual_seed(5)
        layer = make()
        manual_seed(5)
        weight, bias = _param(*shape[0]), _param(*shape[1])
        init.kaiming_uniform_(weight, a=math.sqrt(5))
        fan_in = int(np.prod(shape[0][1:]))
        init.uniform_(bias, -1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in))
        np.testing.assert_array_equal(layer.weight.array, weight.array)
        np.testing.assert_array_equal(layer.bias.array, bias.array)
    empty = _param(3, 0)
    init.affine_default_(empty, _param(3))
    assert empty.shape == (3, 0)
    bias = _param(3)
    init.affine_default_(_param(3, 0), bias)
    np.testing.assert_array_equal(bias.array, 0)
