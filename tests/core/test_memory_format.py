"""torch's memory formats over NumPy strides: ``torch.channels_last`` is an NHWC-strided array
of the same (N, C, H, W) shape, as in torch; ``to``, ``contiguous``, ``is_contiguous``,
``stride``, ``Module.to`` and the ``*_like`` factories take ``memory_format=`` as torch's
do; values and gradients are torch's, and a model laid out channels-last computes the same
loss and gradients bit for bit as the contiguous one."""
from __future__ import annotations

import pickle

import numpy as np
import pytest

import neural_arch as na
import neural_arch.functional as F
from neural_arch import nn
from neural_arch.core import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(30)

FORMATS = ["contiguous_format", "channels_last", "preserve_format"]


def pair(shape, seed=0):
    data = np.random.default_rng(seed).standard_normal(shape)
    return Tensor(data.copy(), requires_grad=True), torch.tensor(data, requires_grad=True)


def test_the_names_are_torchs():
    for name in FORMATS + ["channels_last_3d"]:
        ours = getattr(na, name)
        assert repr(ours) == repr(getattr(torch, name)) == f"torch.{name}"
        assert isinstance(ours, na.memory_format)
        assert pickle.loads(pickle.dumps(ours)) is ours


@pytest.mark.parametrize("source", ["contiguous", "channels_last", "transposed", "unit"])
@pytest.mark.parametrize("name", FORMATS)
def test_to_contiguous_and_factories_lay_out_as_torch(source, name):
    shape = (2, 3, 1, 1) if source == "unit" else (2, 3, 4, 5)
    leaf, tleaf = pair(shape)
    x, tx = leaf * 1.0, tleaf * 1.0
    if source == "channels_last":
        x, tx = x.to(memory_format=na.channels_last), tx.to(memory_format=torch.channels_last)
    elif source == "transposed":
        x, tx = x.transpose(2, 3), tx.transpose(2, 3)
    assert x.stride() == tx.stride()
    ours, theirs = getattr(na, name), getattr(torch, name)
    for fmt_ours, fmt_theirs in ((na.channels_last, torch.channels_last), (ours, theirs)):
        assert x.is_contiguous(memory_format=fmt_ours) == tx.is_contiguous(
            memory_format=fmt_theirs)
    y, ty = x.to(memory_format=ours), tx.to(memory_format=theirs)
    assert y.stride() == ty.stride() and (y is x) == (ty is tx)
    for like in ("empty_like", "zeros_like", "ones_like"):
        assert (getattr(na, like)(x, memory_format=ours).stride()
                == getattr(torch, like)(tx, memory_format=theirs).stride()), like
    assert (na.full_like(x, 2.0, memory_format=ours).stride()
            == torch.full_like(tx, 2.0, memory_format=theirs).stride())
    if name != "preserve_format":
        c, tc = x.contiguous(memory_format=ours), tx.contiguous(memory_format=theirs)
        assert c.stride() == tc.stride() and (c is x) == (tc is tx)
    weights = np.random.default_rng(1).standard_normal(tuple(y.shape))
    (y * Tensor(weights)).sum().backward()
    (ty * torch.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(y.numpy(), ty.detach().numpy())
    np.testing.assert_array_equal(leaf.grad.numpy(), tleaf.grad.numpy())


@pytest.mark.parametrize("call", ["to", "contiguous", "empty_like", "zeros_like", "Module.to"])
def test_a_wrong_rank_raises_torchs_error(call):
    x, tx = Tensor(np.ones((2, 3, 4))), torch.ones(2, 3, 4)
    conv, tconv = nn.Conv2d(2, 3, 3), torch.nn.Conv2d(2, 3, 3)
    for lib, t, fmt3d in ((na, x, na.channels_last_3d), (torch, tx, torch.channels_last_3d)):
        attempt = {"to": lambda: t.to(memory_format=lib.channels_last),
                   "contiguous": lambda: t.contiguous(memory_format=lib.channels_last),
                   "empty_like": lambda: lib.empty_like(t, memory_format=lib.channels_last),
                   "zeros_like": lambda: lib.zeros_like(t, memory_format=lib.channels_last),
                   "Module.to": lambda: (conv if lib is na else tconv).to(
                       memory_format=fmt3d)}[call]
        rank = 5 if call == "Module.to" else 4
        with pytest.raises(RuntimeError, match=f"required rank {rank} tensor to use "
                                               f"channels_last(_3d)? format"):
            attempt()
    assert x.is_contiguous(memory_format=na.channels_last) is False  # asked, not refused
    with pytest.raises(RuntimeError, match="preserve memory format is unsupported"):
        x.contiguous(memory_format=na.preserve_format)
    with pytest.raises(TypeError, match="memory_format"):
        x.to(memory_format="channels_last")
    with pytest.raises(TypeError, match="must be torch.memory_format, not NoneType"):
        x.is_contiguous(memory_format=None)
    x4, tx4 = Tensor(np.ones((2, 3, 4, 5))).transpose(2, 3), torch.ones(2, 3, 4, 5).transpose(2, 3)
    assert x4.to(memory_format=None) is x4  # None is preserve_format, as in torch
    assert na.zeros_like(x4, memory_format=None).stride() == torch.zeros_like(
        tx4, memory_format=None).stride()


def test_a_channels_last_model_computes_torchs_values_and_the_contiguous_ones_bitwise():
    torch.manual_seed(0)
    tmodel = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.Tanh(),
                                 torch.nn.Conv2d(4, 2, 3),
                                 torch.nn.Flatten(), torch.nn.Linear(2 * 5 * 5, 5))
    tmodel = tmodel.double().to(memory_format=torch.channels_last)
    x = np.random.default_rng(0).standard_normal((2, 3, 7, 7))
    results = []
    for layout in (None, na.channels_last):
        model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.Tanh(),
                              nn.Conv2d(4, 2, 3), nn.Flatten(), nn.Linear(50, 5))
        model = model.double()
        for mine, theirs in zip(model.parameters(), tmodel.parameters()):
            mine.array[...] = theirs.detach().numpy()
        inputs = Tensor(x)
        if layout is not None:
            assert model.to(memory_format=layout) is model
            weight = model[0].weight
            assert weight.is_contiguous(memory_format=layout) and weight.stride() == \
                tmodel[0].weight.stride()
            assert model[4].weight.is_contiguous()  # 2-D: left as it is, as torch leaves it
            inputs = inputs.to(memory_format=layout)
        loss = (model(inputs) ** 2).sum()
        loss.backward()
        results.append((loss.item(), [p.grad.numpy().copy() for p in model.parameters()]))
    tloss = (tmodel(torch.tensor(x).to(memory_format=torch.channels_last)) ** 2).sum()
    tloss.backward()
    (plain, plain_grads), (laid_out, laid_out_grads) = results
    assert plain == laid_out
    for a, b, t in zip(plain_grads, laid_out_grads, tmodel.parameters()):
        np.testing.assert_array_equal(a, b)
        np.testing.assert_allclose(b, t.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(laid_out, tloss.item(), rtol=1e-12)
