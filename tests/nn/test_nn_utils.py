"""``nn.utils`` (gradient clipping, parameter vectors) against torch, and torch's ``device=`` /
``dtype=`` keywords on the common layers."""
import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn
from neural_arch.core import Tensor

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)

RNG = np.random.default_rng(3)


def _pair(shapes, dtype=np.float32, scale=3.0):
    """Parameters with the same data and gradients here and in torch."""
    ours, theirs = [], []
    for shape in shapes:
        data, grad = RNG.standard_normal(shape).astype(dtype), \
            (RNG.standard_normal(shape) * scale).astype(dtype)
        mine = nn.Parameter(data.copy())
        mine.grad = grad.copy()
        reference = torch.nn.Parameter(torch.tensor(data))
        reference.grad = torch.tensor(grad)
        ours.append(mine)
        theirs.append(reference)
    return ours, theirs


def test_torch_path_is_a_package():
    import neural_arch.nn.utils as utils
    from neural_arch.nn.utils import clip_grad_norm_, parameters_to_vector  # noqa: F401
    assert na.nn.utils is utils
    assert utils.clip_grad_value_ is na.optim.clip_grad_value_


@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0, float("inf")])
@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_grad_norm_values_and_returned_norm(norm_type, max_norm):
    ours, theirs = _pair([(3, 4), (4,), (2, 2, 2)])
    total = nn.utils.clip_grad_norm_(ours, max_norm, norm_type=norm_type, foreach=None)
    expected = torch.nn.utils.clip_grad_norm_(theirs, max_norm, norm_type=norm_type)
    assert isinstance(total, Tensor) and total.shape == () and total.dtype == np.float32
    np.testing.assert_allclose(total.item(), expected.item(), rtol=1e-5)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_allclose(mine.grad, reference.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_clip_grad_norm_of_a_single_tensor_and_nonfinite_error():
    ours, theirs = _pair([(5,)])
    total = nn.utils.clip_grad_norm_(ours[0], 1.0)
    np.testing.assert_allclose(float(total),
                               float(torch.nn.utils.clip_grad_norm_(theirs[0], 1.0)), rtol=1e-6)
    ours[0].grad[0] = np.inf
    with pytest.raises(RuntimeError, match="error_if_nonfinite=False"):
        nn.utils.clip_grad_norm_(ours, 1.0, error_if_nonfinite=True)


def test_clip_grad_value_matches_torch():
    ours, theirs = _pair([(3, 4), (2,)])
    assert nn.utils.clip_grad_value_(ours, 0.7) is None
    torch.nn.utils.clip_grad_value_(theirs, 0.7)
    for mine, reference in zip(ours, theirs):
        np.testing.assert_array_equal(mine.grad, reference.grad.numpy())


def test_parameter_vector_round_trip_matches_torch():
    ours, theirs = _pair([(3, 4), (4,), (2, 1)], dtype=np.float64)
    vector = nn.utils.parameters_to_vector(ours)
    np.testing.assert_array_equal(vector.array, torch.nn.utils.parameters_to_vector(theirs)
                                  .detach().numpy())
    assert vector.shape == (18,)
    identities = [id(p) for p in ours]
    nn.utils.vector_to_parameters(Tensor(np.arange(18.0)), ours)
    assert [id(p) for p in ours] == identities
    np.testing.assert_array_equal(ours[1].array, [12.0, 13.0, 14.0, 15.0])
    np.testing.assert_array_equal(nn.utils.parameters_to_vector(ours).array, np.arange(18.0))
    with pytest.raises(TypeError, match="expected a Tensor"):
        nn.utils.vector_to_parameters(np.arange(18.0), ours)


def test_parameters_to_vector_is_differentiable():
    ours, _ = _pair([(2, 2), (3,)], dtype=np.float64)
    for param in ours:
        param.grad = None
    weights = RNG.standard_normal(7)
    (nn.utils.parameters_to_vector(ours) * Tensor(weights)).sum().backward()
    np.testing.assert_array_equal(ours[0].grad, weights[:4].reshape(2, 2))
    np.testing.assert_array_equal(ours[1].grad, weights[4:])


@pytest.mark.parametrize("make", [
    lambda **kw: nn.Linear(3, 2, **kw),
    lambda **kw: nn.Embedding(5, 3, **kw),
    lambda **kw: nn.LayerNorm(4, **kw),
    lambda **kw: nn.MultiheadAttention(4, 2, **kw),
    lambda **kw: nn.CausalSelfAttention(4, 2, **kw),
])
def test_layers_take_torch_device_and_dtype_keywords(make):
    layer = make(device="cpu", dtype=na.float64)
    assert all(p.dtype == np.float64 and p.device == "cpu" for p in layer.parameters())
    layer = make(device=None, dtype=None)
    assert all(p.dtype == np.float32 for p in layer.parameters())
