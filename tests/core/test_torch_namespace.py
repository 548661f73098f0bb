"""torch's top-level dtypes, ``device``, ``Generator``, creation and sampling functions and grad
modes, reached as ``import neural_arch as torch`` does, checked against torch itself (skipped
without it). Selection, einsum and a ported generate loop: test_torch_namespace_ops.py."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import neural_arch as na

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


# ------------------------------------------------------------------ dtypes, device, Generator
def test_dtype_names_match_torch_widths(torch):
    for name in ("long", "int64", "int", "int32", "float", "float32", "double", "float64",
                 "half", "float16", "bool", "uint8", "int8", "int16", "short"):
        ours, theirs = getattr(na, name), getattr(torch, name)
        assert np.dtype(ours).itemsize == theirs.itemsize, name
        assert np.dtype(ours).kind == ("b" if name == "bool" else
                                       "f" if theirs.is_floating_point else
                                       "u" if name == "uint8" else "i"), name
    t = na.zeros(2, 3, dtype=na.long)
    assert t.dtype == na.long and t.dtype == np.int64
    assert na.ones(2, dtype=na.bool).dtype == np.bool_
    assert na.tensor([1.5]).to(na.double).dtype == np.float64
    assert "int" not in na.__all__ and "float" not in na.__all__


def test_device_spells_like_torch(torch):
    for args in (("cpu",), ("cuda",), ("cuda:1",), ("cuda", 2), ("cpu", 0)):
        ours, theirs = na.device(*args), torch.device(*args)
        assert (str(ours), repr(ours)) == (str(theirs), repr(theirs)), args
        assert (ours.type, ours.index) == (theirs.type, theirs.index)
    assert na.device(0) == "cuda:0"  # torch's int form (its check needs an accelerator)
    assert na.device(na.device("cuda:3")) == "cuda:3"
    assert pickle.loads(pickle.dumps(na.device("cuda", 1))).index == 1
    with pytest.raises(RuntimeError, match="device type"):
        na.device("tpu")
    with pytest.raises(RuntimeError, match="already has an index"):
        na.device("cuda:1", 2)


def test_device_is_accepted_where_a_device_string_is():
    cpu = na.device("cpu")
    x = na.tensor([1.0, 2.0], requires_grad=True)
    moved = x.to(cpu)
    assert moved.device == cpu and x.device == na.device("cpu")
    assert na.zeros(2, device=cpu).device == "cpu"
    assert na.randn(2, device=cpu).shape == (2,)
    moved.sum().backward()
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])


def test_generator_seeds_reproducibly(torch):
    g = na.Generator()
    assert g.initial_seed() == torch.Generator().initial_seed()
    assert g.manual_seed(7) is g and g.initial_seed() == 7
    samplers = (lambda **k: na.randn(2, 3, **k), lambda **k: na.rand((4,), **k),
                lambda **k: na.randint(0, 10, (5,), **k), lambda **k: na.randperm(6, **k),
                lambda **k: na.multinomial(na.tensor([0.2, 0.8]), 3, True, **k))
    for sample in samplers:
        first = sample(generator=na.Generator().manual_seed(3)).numpy()
        np.testing.assert_array_equal(sample(generator=na.Generator().manual_seed(3)).numpy(),
                                      first)
    state = g.get_state()
    first = na.rand(3, generator=g).numpy()
    g.set_state(state)
    np.testing.assert_array_equal(na.rand(3, generator=g).numpy(), first)
    seed = g.seed()
    assert g.initial_seed() == seed
    assert g.manual_seed(-1).initial_seed() == 2 ** 64 - 1
    with pytest.raises(TypeError, match="generator must be"):
        na.randn(2, generator=1)


# ------------------------------------------------------------------ random creation
def test_random_factories_sizes_dtypes_and_ranges(torch):
    for ours, theirs in ((na.randn(2, 3), torch.randn(2, 3)), (na.rand((2, 3)), torch.rand((2, 3))),
                         (na.randint(5, (4,)), torch.randint(5, (4,))),
                         (na.randint(2, 5, (3, 2)), torch.randint(2, 5, (3, 2))),
                         (na.randperm(5), torch.randperm(5))):
        assert ours.shape == tuple(theirs.shape)
        assert ours.dtype.itemsize == theirs.dtype.itemsize
    assert sorted(na.randperm(7).tolist()) == list(range(7))
    ints = na.randint(-3, 3, (1000,)).numpy()
    assert ints.min() == -3 and ints.max() == 2
    assert na.randn(3, requires_grad=True, dtype=na.double).requires_grad
    assert na.randint(0, 4, size=(2,), dtype=na.float).dtype == np.float32
    with pytest.raises(RuntimeError, match="low=5 >= high=5"):
        na.randint(5, 5, (2,))
    like = na.zeros(2, 3, dtype=na.double)
    assert na.randn_like(like).dtype == np.float64 and na.rand_like(like).shape == (2, 3)
    assert 0 <= na.rand_like(like).numpy().min() and na.rand_like(like).numpy().max() < 1
    with pytest.raises(TypeError, match="floating dtype"):
        na.randn_like(na.zeros(2, dtype=na.long))


def test_multinomial_frequencies_and_rules(torch):
    weights = na.tensor([[1.0, 0.0, 3.0], [0.0, 2.0, 2.0]])  # rows need not sum to 1
    drawn = na.multinomial(weights, 4000, replacement=True,
                           generator=na.Generator().manual_seed(1))
    assert drawn.shape == (2, 4000) and drawn.dtype == np.int64
    counts = [np.bincount(row, minlength=3) / 4000 for row in drawn.numpy()]
    np.testing.assert_allclose(counts[0], [0.25, 0.0, 0.75], atol=0.03)
    np.testing.assert_allclose(counts[1], [0.0, 0.5, 0.5], atol=0.03)
    without = na.multinomial(na.tensor([5.0, 1.0, 0.0, 2.0]), 3)
    assert sorted(without.tolist()) == [0, 1, 3]  # distinct, never the zero weight
    first = [na.multinomial(na.tensor([8.0, 1.0, 1.0]), 2).tolist()[0] for _ in range(400)]
    assert 0.7 < first.count(0) / 400 < 0.9  # drawn in order: the first is the heaviest 80%
    assert na.multinomial(na.tensor([1.0, 1.0]), 0).shape == (0,)
    for bad, match in (([1.0, -1.0], "element < 0"), ([0.0, 0.0], "sum of probabilities"),
                       ([1.0, float("nan")], "nan")):
        with pytest.raises(RuntimeError, match=match):
            na.multinomial(na.tensor(bad), 1, True)
    with pytest.raises(RuntimeError, match="without replacement"):
        na.multinomial(na.tensor([1.0, 1.0]), 3)
    with pytest.raises(RuntimeError, match="non-zero weight"):  # torch returns a zero-weight one
        na.multinomial(na.tensor([1.0, 0.0, 0.0]), 2)


# ------------------------------------------------------------------ deterministic creation
def test_linspace_arange_and_like_factories(torch):
    for args, kwargs in (((0, 1, 5), {}), ((-2.5, 7, 13), {}), ((3, 3, 1), {}), ((0, 1, 0), {}),
                         ((0, 10, 4), {"dtype": "long"}), ((1, 2, 6), {"dtype": "double"})):
        ours = na.linspace(*args, **{k: getattr(na, v) for k, v in kwargs.items()})
        theirs = torch.linspace(*args, **{k: getattr(torch, v) for k, v in kwargs.items()})
        assert ours.dtype.itemsize == theirs.dtype.itemsize
        np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=1e-6, atol=1e-6)
    for args in ((5,), (2, 9, 3), (0.5, 3.0, 0.5)):
        np.testing.assert_allclose(na.arange(*args).numpy(), torch.arange(*args).numpy())
        assert na.arange(*args).dtype.itemsize == torch.arange(*args).dtype.itemsize
    x = na.tensor([[1, 2], [3, 4]])
    full = na.full_like(x, 7)
    assert full.dtype == x.dtype and full.tolist() == [[7, 7], [7, 7]]
    assert na.full_like(x, 0.5, dtype=na.float).tolist() == [[0.5, 0.5], [0.5, 0.5]]
    assert na.empty_like(x).shape == (2, 2) and na.empty_like(x).dtype == np.int64
    assert na.zeros_like(x).dtype == np.int64 and na.ones_like(x, dtype=na.half).dtype == np.float16


def test_numel_allclose_from_numpy(torch):
    assert na.numel(na.zeros(2, 3, 4)) == torch.numel(torch.zeros(2, 3, 4)) == 24
    assert na.numel(na.zeros(0, 3)) == 0
    a, b = na.tensor([1.0, 2.0]), na.tensor([1.0, 2.0 + 1e-6])
    assert na.allclose(a, b) == torch.allclose(torch.tensor([1.0, 2.0]),
                                               torch.tensor([1.0, 2.0 + 1e-6]))
    assert not na.allclose(a, na.tensor([1.0, 2.1]))
    nan = na.tensor([float("nan")])
    assert not na.allclose(nan, nan) and na.allclose(nan, nan, equal_nan=True)
    array = np.zeros(3)
    shared = na.from_numpy(array)
    array[1] = 5.0
    assert shared.tolist() == [0.0, 5.0, 0.0]


# ------------------------------------------------------------------ grad modes
def test_grad_mode_context_managers_and_decorators():
    x = na.tensor([1.0], requires_grad=True)
    with na.no_grad():
        assert not (x * 2).requires_grad
        with na.enable_grad():
            assert (x * 2).requires_grad
    with na.set_grad_enabled(False):
        assert not (x * 2).requires_grad
    with na.inference_mode():
        assert not (x * 2).requires_grad
    with na.inference_mode(False):
        assert (x * 2).requires_grad
    with na.no_grad(), na.inference_mode(False):
        assert not (x * 2).requires_grad  # mode=False leaves grad mode alone, as in torch

    @na.inference_mode()
    def infer(t):
        return (t * 2).requires_grad

    @na.no_grad()
    def frozen(t):
        return (t * 2).requires_grad

    assert not infer(x) and not frozen(x) and (x * 2).requires_grad
