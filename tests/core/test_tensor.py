"""Tensor construction, attributes, dtypes, grad modes and the errors the core raises."""
import numpy as np
import pytest

import neural_arch as na
from neural_arch import Tensor

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("data,dtype", [
    (1.5, np.float32), ([1.0, 2.0], np.float32), ([[1, 2.5]], np.float32), (3, np.int64),
    ([1, 2, 3], np.int64), (True, np.bool_), (np.arange(3, dtype=np.float64), np.float64),
    (np.ones(2, np.float16), np.float16), (np.arange(3, dtype=np.int32), np.int32),
    (np.float64(2.0), np.float64),
])
def test_construction_dtype_rules(data, dtype):
    t = Tensor(data)
    assert t.dtype == dtype
    np.testing.assert_array_equal(t.array, np.asarray(data))


def test_construction_from_tensor_and_casts():
    base = Tensor(np.arange(4.0))
    assert Tensor(base).array is base.array
    assert Tensor([1, 2], dtype="float64").dtype == np.float64
    assert Tensor([1.7, 2.2], dtype=np.int64).array.tolist() == [1, 2]
    assert na.tensor([1, 2], dtype="float16").dtype == np.float16
    array = np.zeros(3)
    assert na.tensor(array).array is not array
    assert na.from_numpy(array).array is array
    with pytest.raises(TypeError, match="from_numpy expects a numpy.ndarray"):
        na.from_numpy([1, 2])


def test_integer_tensor_cannot_require_grad():
    with pytest.raises(TypeError, match="only floating tensors can require grad, got dtype int64"):
        Tensor([1, 2], requires_grad=True)
    with pytest.raises(TypeError, match="dtype bool"):
        Tensor([True]).requires_grad_()
    with pytest.raises(TypeError, match="cannot make a tensor from str"):
        Tensor("abc")


def test_attributes_and_conversions():
    t = Tensor(np.arange(6.0).reshape(2, 3), name="weights")
    assert t.shape == (2, 3) and t.ndim == 2 and t.numel() == 6 and len(t) == 2
    assert t.device == "cpu" and t.name == "weights" and t.is_leaf
    assert t.T.shape == (3, 2) and t.tolist() == [[0, 1, 2], [3, 4, 5]]
    assert t.numpy() is t.array and Tensor(2.5).item() == 2.5
    assert float(Tensor([3.0])) == 3.0 and int(Tensor(4)) == 4
    assert "requires_grad=True" in repr(Tensor([1.0], requires_grad=True))
    assert "weights" in repr(t) and repr(Tensor([1.0, 2.0])).startswith("tensor([1., 2.]")
    t.array[0, 0] = 7.0
    assert t.array[0, 0] == 7.0
    t.array = np.zeros((1,))
    assert t.shape == (1,)
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d tensor"):
        len(Tensor(1.0))
    with pytest.raises(ValueError, match="one element, got shape \\(2,\\)"):
        Tensor([1.0, 2.0]).item()
    with pytest.raises(ValueError, match="ambiguous"):
        bool(Tensor([1.0, 2.0]))


def test_detach_clone_astype_to():
    x = Tensor([1.0, 2.0], requires_grad=True)
    d = x.detach()
    assert not d.requires_grad and d.array is x.array
    c = x.clone()
    assert c.array is not x.array and c.requires_grad
    y = x.astype("float64")
    assert y.dtype == np.float64
    (c * 2 + y * 3).sum().backward()
    np.testing.assert_allclose(x.grad, [5.0, 5.0])
    assert x.grad.dtype == np.float32
    assert x.to("cpu") is x and x.astype(np.float32) is x
    assert x.to(np.float64).dtype == np.float64
    assert x.astype("int64").requires_grad is False


def test_cuda_device_without_gpu_raises_clear_error():
    from neural_arch.backends import get_backend

    if get_backend("cupy").is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        Tensor([1.0], device="cuda")
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        Tensor([1.0]).to("cuda")
    with pytest.raises(ValueError, match="unknown device 'tpu'"):
        Tensor([1.0], device="tpu")


def test_an_int_device_is_a_gpu_index_as_in_torch():
    # torch's `t.to(0)` / `model.to(local_rank)` move to cuda:0; an int is never a dtype
    from neural_arch.backends import device_type, get_backend
    from neural_arch.nn import Linear

    assert device_type(0) == "cuda" and device_type(3) == "cuda"
    with pytest.raises(ValueError, match="device index must be >= 0, got -1"):
        Tensor([1.0]).to(-1)
    with pytest.raises(ValueError, match="unknown device True"):
        Tensor([1.0]).to(True)
    if get_backend("cupy").is_available():
        assert Tensor([1.0]).to(0).device == "cuda"
        assert Linear(2, 2).to(0).weight.device == "cuda"
        return
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        Tensor([1.0]).to(0)
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        Tensor([1.0]).to(0, dtype="float64")
    with pytest.raises(RuntimeError, match="device 'cuda' is not available"):
        Linear(2, 2).to(0)


def test_factories_and_seeding():
    assert na.zeros(2, 3).dtype == np.float32 and na.zeros((2, 3)).shape == (2, 3)
    assert na.ones(4, dtype="float64").dtype == np.float64
    assert na.zeros_like(Tensor(np.ones((2, 2)))).dtype == np.float64
    np.testing.assert_array_equal(na.ones_like(Tensor([1, 2])).array, [1, 1])
    assert na.arange(5).dtype == np.int64 and na.arange(0, 1, 0.25).dtype == np.float32
    np.testing.assert_array_equal(na.arange(2, 8, 2).array, [2, 4, 6])
    assert na.randn(3, 4, requires_grad=True).requires_grad
    np.testing.assert_array_equal(na.randn(5, seed=3).array, na.randn(5, seed=3).array)
    rng = np.random.default_rng(9)
    expected = np.random.default_rng(9).random(4).astype(np.float32)
    np.testing.assert_array_equal(na.rand(4, rng=rng).array, expected)
    na.manual_seed(11)
    first = na.randn(6).array
    assert na.get_rng() is na.core.random.get_rng()
    na.manual_seed(11)
    np.testing.assert_array_equal(na.randn(6).array, first)
    np.testing.assert_array_equal(first, np.random.default_rng(11).standard_normal(6)
                                  .astype(np.float32))
    with pytest.raises(ValueError, match="seed must be a non-negative integer, got -1"):
        na.manual_seed(-1)


def test_comparisons_argmax_and_setitem():
    a = Tensor([1.0, 5.0, 3.0], requires_grad=True)
    for result, expected in [(a < 3, [True, False, False]), (a <= 3, [True, False, True]),
                             (a > 3, [False, True, False]), (a >= 3, [False, True, True]),
                             (a == 5, [False, True, False]), (a != 5, [True, False, True]),
                             (3 > a, [True, False, False])]:
        assert result.dtype == np.bool_ and not result.requires_grad
        assert result.tolist() == expected
    assert a.argmax().item() == 1
    assert Tensor([[1, 9], [8, 2]]).argmax(axis=1).tolist() == [1, 0]
    assert ((a > 2) & (a < 4)).tolist() == [False, False, True]
    assert (~(a > 2)).tolist() == [True, False, False]
    with pytest.raises(RuntimeError, match="a leaf Variable that requires grad is being used in an in-place"):
        a[0] = 2.0
    with na.no_grad():
        a[0] = 2.0
    assert a.array[0] == 2.0
    assert {a: 1}[a] == 1  # tensors hash by identity


def test_shape_errors_name_both_shapes():
    a, b = Tensor(np.ones((3, 4))), Tensor(np.ones((4, 3)))
    with pytest.raises(ValueError, match=r"add: cannot broadcast shapes \(3, 4\) and \(4, 3\)"):
        a + b
    with pytest.raises(ValueError, match=r"mul: cannot broadcast shapes \(3, 4\) and \(2,\)"):
        a * np.ones(2)
    with pytest.raises(ValueError, match=r"matmul shape mismatch: \(3, 4\) @ \(3, 4\)"):
        a @ a
    with pytest.raises(ValueError, match=r"matmul shape mismatch: \(4,\) @ \(3,\)"):
        Tensor(np.ones(4)) @ Tensor(np.ones(3))
    with pytest.raises(ValueError, match=r"batch dimensions of \(2, 3, 4\) and \(3, 4, 5\)"):
        Tensor(np.ones((2, 3, 4))) @ Tensor(np.ones((3, 4, 5)))
    with pytest.raises(ValueError, match=r"at least 1 dimension, got shapes \(\) and \(3,\)"):
        Tensor(1.0) @ Tensor(np.ones(3))
    with pytest.raises(ValueError, match=r"cannot reshape tensor of shape \(3, 4\) .* \(5,\)"):
        a.reshape(5)
    with pytest.raises(ValueError, match=r"cannot expand shape \(3, 4\) to shape \(3, 5\)"):
        a.expand(3, 5)
    with pytest.raises(ValueError, match=r"not a permutation .* shape \(3, 4\)"):
        a.permute(0, 0)
    with pytest.raises(ValueError, match=r"concatenate along axis 0: incompatible shapes "
                                         r"\[\(3, 4\), \(4, 3\)\]"):
        na.concatenate([a, b])
    with pytest.raises(ValueError, match="axis 2 is out of range for a tensor with 2 dim"):
        a.sum(axis=2)


def test_factory_exports_at_top_level_and_core():
    import neural_arch.core as core

    for name in ["Tensor", "no_grad", "enable_grad", "is_grad_enabled", "gradcheck",
                 "concatenate", "cat", "stack", "where", "tensor", "zeros", "ones", "randn",
                 "rand", "arange", "zeros_like", "ones_like", "from_numpy", "manual_seed"]:
        assert getattr(na, name) is getattr(core, name)
    assert na.functional.linear is not None


def test_package_import_is_lazy_about_subpackages():
    import subprocess
    import sys

    code = ("import sys, neural_arch as na\n"
            "eager = [m for m in ('nn', 'optim', 'data', 'models', 'distributed')\n"
            "         if 'neural_arch.' + m in sys.modules]\n"
            "assert not eager, eager\n"
            "assert na.nn is sys.modules['neural_arch.nn']\n"
            "print('ok')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
    with pytest.raises(AttributeError, match="has no attribute 'nonexistent'"):
        na.nonexistent
