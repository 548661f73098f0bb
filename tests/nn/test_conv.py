"""Conv1d / Conv2d and F.conv1d / F.conv2d: values and gradients against torch, errors, init."""
import math

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch import nn
from neural_arch.core import Tensor, gradcheck, manual_seed

pytestmark = pytest.mark.timeout(60)

# (stride, padding, dilation, groups, bias): strided, padded, dilated, grouped, "same"/"valid"
CONV_CASES = [
    (1, 0, 1, 1, True),
    (2, 1, 1, 1, False),
    (1, "same", 2, 1, True),
    (1, "valid", 1, 3, True),
    (3, 2, 2, 3, False),
    (2, 0, 1, 6, True),  # depthwise
]


def _torch_conv(torch, spatial, x, w, b, stride, padding, dilation, groups, gout):
    tx = torch.tensor(x, requires_grad=True)
    tw = torch.tensor(w, requires_grad=True)
    tb = None if b is None else torch.tensor(b, requires_grad=True)
    conv = torch.nn.functional.conv2d if spatial == 2 else torch.nn.functional.conv1d
    out = conv(tx, tw, tb, stride, padding, dilation, groups)
    out.backward(torch.tensor(gout))
    return out.detach().numpy(), tx.grad.numpy(), tw.grad.numpy(), \
        None if tb is None else tb.grad.numpy()


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: even-kernel "same" makes a copy
@pytest.mark.parametrize("spatial", [1, 2])
@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-10), (np.float32, 2e-4)])
@pytest.mark.parametrize("case", CONV_CASES)
def test_conv_matches_torch(spatial, dtype, tol, case):
    torch = pytest.importorskip("torch")
    stride, padding, dilation, groups, has_bias = case
    rng = np.random.default_rng(0)
    # odd, unequal sizes; a 3x2 kernel in 2-D; batch of 2 and of 1
    for batch in (2, 1):
        x = rng.standard_normal((batch, 6) + ((9, 7) if spatial == 2 else (11,))).astype(dtype)
        kernel = (3, 2) if spatial == 2 else (4,)
        w = rng.standard_normal((6, 6 // groups) + kernel).astype(dtype)
        b = rng.standard_normal(6).astype(dtype) if has_bias else None
        X, W = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
        B = None if b is None else Tensor(b, requires_grad=True)
        conv = F.conv2d if spatial == 2 else F.conv1d
        out = conv(X, W, B, stride, padding, dilation, groups)
        gout = rng.standard_normal(out.shape).astype(dtype)
        out.backward(gout)
        ref, gx, gw, gb = _torch_conv(torch, spatial, x, w, b, stride, padding, dilation,
                                      groups, gout)
        assert out.dtype == dtype and out.shape == ref.shape
        np.testing.assert_allclose(out.array, ref, rtol=tol, atol=tol)
        np.testing.assert_allclose(X.grad, gx, rtol=tol, atol=tol)
        np.testing.assert_allclose(W.grad, gw, rtol=tol, atol=tol)
        if b is not None:
            np.testing.assert_allclose(B.grad, gb, rtol=tol, atol=tol)


def test_conv_gradients_against_finite_differences():
    rng = np.random.default_rng(1)
    x = Tensor(rng.standard_normal((2, 4, 5, 6)), requires_grad=True)
    w = Tensor(rng.standard_normal((6, 2, 3, 2)), requires_grad=True)
    b = Tensor(rng.standard_normal(6), requires_grad=True)
    assert gradcheck(lambda a, c, d: F.conv2d(a, c, d, stride=(2, 1), padding=(1, 2),
                                              dilation=(1, 2), groups=2), [x, w, b])
    x1 = Tensor(rng.standard_normal((3, 2, 7)), requires_grad=True)
    w1 = Tensor(rng.standard_normal((2, 2, 3)), requires_grad=True)
    assert gradcheck(lambda a, c: F.conv1d(a, c, padding="same", dilation=2), [x1, w1])


def test_conv_modules_match_torch_modules_and_unbatched_input():
    torch = pytest.importorskip("torch")
    manual_seed(0)
    ours = nn.Conv2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2), groups=2, dtype=np.float64)
    theirs = torch.nn.Conv2d(4, 6, (3, 5), stride=(2, 1), padding=(1, 2), groups=2,
                             dtype=torch.float64)
    with torch.no_grad():
        theirs.weight.copy_(torch.from_numpy(ours.weight.array))
        theirs.bias.copy_(torch.from_numpy(ours.bias.array))
    x = np.random.default_rng(2).standard_normal((4, 8, 9))  # unbatched (C, H, W)
    np.testing.assert_allclose(ours(x).array, theirs(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    conv1 = nn.Conv1d(3, 5, 3, padding="same", bias=False)
    assert conv1.weight.shape == (5, 3, 3) and conv1.bias is None
    assert conv1(np.zeros((2, 3, 10), np.float32)).shape == (2, 5, 10)
    assert conv1(np.zeros((3, 10), np.float32)).shape == (5, 10)
    assert repr(ours) == repr(theirs).replace("torch.float64", "")


def test_conv_default_init_has_torch_bounds():
    manual_seed(3)
    conv = nn.Conv2d(8, 64, 3)
    fan_in = 8 * 9
    bound = 1.0 / math.sqrt(fan_in)  # kaiming_uniform(a=sqrt(5)) gives the same bound
    for p in (conv.weight.array, conv.bias.array):
        assert np.abs(p).max() <= bound and np.abs(p).max() > 0.9 * bound
    assert conv.weight.dtype == np.float32
    assert abs(conv.weight.array.std() - bound / math.sqrt(3)) < 0.1 * bound


@pytest.mark.parametrize("build,message", [
    (lambda: nn.Conv2d(4, 6, 3, groups=4), "divisible by groups=4"),
    (lambda: nn.Conv2d(4, 6, 3, stride=2, padding="same"), "strided"),
    (lambda: nn.Conv2d(4, 6, 3, padding="full"), "'full'"),
    (lambda: nn.Conv2d(4, 6, 3, padding_mode="reflect"), "only padding_mode='zeros'"),
    (lambda: nn.Conv2d(4, 6, 3, padding_mode="mirror"), "'mirror'"),
    (lambda: nn.Conv2d(4, 6, 0), "kernel_size must be >= 1"),
])
def test_conv_constructor_errors(build, message):
    with pytest.raises(ValueError, match=message):
        build()


def test_conv_call_errors_name_the_shapes():
    conv = nn.Conv2d(4, 6, 3)
    with pytest.raises(ValueError, match=r"\(2, 3, 8, 8\) has 3 channels"):
        conv(np.zeros((2, 3, 8, 8), np.float32))
    with pytest.raises(ValueError, match="smaller than the dilated kernel"):
        conv(np.zeros((1, 4, 2, 8), np.float32))
    with pytest.raises(ValueError, match="4-D input"):
        conv(np.zeros((1, 1, 4, 8, 8), np.float32))
    with pytest.raises(TypeError, match="float64.*float32"):
        conv(np.zeros((1, 4, 8, 8), np.float64))
