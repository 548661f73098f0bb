"""A unit's flat layout packs every gradient of every step: the packed vector equals the
parameters laid back to back (missing gradients as zeros, zero padding, the reduction dtype),
and a gradient of the wrong size is refused by name instead of being spread over its slot."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.fsdp.flat_param import FlatLayout

pytestmark = pytest.mark.timeout(30)


class _Param:
    def __init__(self, array: np.ndarray) -> None:
        self.array = array


def _layout(shapes, shards):
    rng = np.random.default_rng(0)
    named = [(f"p{i}", _Param(rng.standard_normal(shape))) for i, shape in enumerate(shapes)]
    return FlatLayout(named, shards), [p.array for _, p in named]


def _reference(layout, arrays, dtype):
    flat = np.zeros(layout.padded_numel, dtype=dtype)
    for entry, array in zip(layout.entries, arrays):
        if array is not None:
            flat[entry.offset:entry.offset + entry.numel] = array.reshape(-1)
    return flat


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.float16])
def test_flatten_equals_the_parameters_back_to_back(dtype):
    layout, arrays = _layout([(3, 4), (), (5,), (1, 1), (2, 3, 2)], shards=3)
    arrays[2] = None  # a parameter that got no gradient packs as zeros
    arrays[3] = np.asfortranarray(arrays[3])
    arrays[4] = arrays[4].transpose(1, 0, 2).copy().transpose(1, 0, 2)  # not C-contiguous
    packed = layout.flatten(arrays, dtype)
    assert packed.dtype == dtype and packed.shape == (layout.padded_numel,)
    assert layout.padded_numel > layout.numel and not packed[layout.numel:].any()
    np.testing.assert_array_equal(packed, _reference(layout, arrays, dtype))
    for view, array in zip(layout.views(packed), arrays):
        want = np.zeros_like(view) if array is None else array.astype(dtype)
        np.testing.assert_array_equal(view, want)


def test_flatten_of_an_empty_layout_is_padding_only():
    layout, _ = _layout([], shards=2)
    assert layout.flatten([], np.float32).shape == (0,)


@pytest.mark.parametrize("wrong", [np.ones(1), np.ones(13)])
def test_flatten_refuses_a_gradient_of_the_wrong_size(wrong):
    layout, arrays = _layout([(4,), (2, 3), (5,)], shards=2)
    arrays[1] = wrong
    with pytest.raises(ValueError, match=r"'p1' has 6 elements \(shape \(2, 3\)\), got "
                                         rf"{wrong.size}"):
        layout.flatten(arrays, np.float32)


def test_flatten_refuses_a_wrong_number_of_arrays():
    layout, arrays = _layout([(4,), (2,)], shards=1)
    with pytest.raises(ValueError, match="1 arrays for a layout of 2 parameters"):
        layout.flatten(arrays[:1], np.float32)
