"""``optimizer.step()`` writes the parameters in place, so, as in torch, it advances their
version counters: a backward through a graph recorded before the step raises torch's error
instead of computing gradients from the updated weights, and a normal loop is unaffected."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core import Tensor
from neural_arch.optim import SGD, Adam, AdamW
from neural_arch.optim.fused_adamw import FusedAdamW

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(30)

MODIFIED = ("one of the variables needed for gradient computation has been modified by an "
            r"inplace operation: \[torch\.\w+ \[[\d, ]+\]\], which is .* is at version \d+; "
            r"expected version \d+ instead")

OPTIMIZERS = {  # name: (ours, torch's, options)
    "sgd": (SGD, torch.optim.SGD, dict(lr=0.1)),
    "sgd-momentum": (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, weight_decay=1e-2)),
    "adam": (Adam, torch.optim.Adam, dict(lr=0.01)),
    "adam-amsgrad": (Adam, torch.optim.Adam, dict(lr=0.01, amsgrad=True)),
    "adamw": (AdamW, torch.optim.AdamW, dict(lr=0.01)),
    "fused-adamw": (FusedAdamW, torch.optim.AdamW, dict(lr=0.01)),
}


def models(seed=0):
    """The same two-layer MLP in both libraries (torch's weights copied into ours)."""
    torch.manual_seed(seed)
    theirs = torch.nn.Sequential(torch.nn.Linear(4, 5), torch.nn.Tanh(), torch.nn.Linear(5, 2))
    ours = nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 2))
    for mine, source in zip(ours.parameters(), theirs.parameters()):
        mine.array[...] = source.detach().numpy()
    x = np.random.default_rng(seed).standard_normal((3, 4)).astype(np.float32)
    return ours, theirs, Tensor(x), torch.tensor(x)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_step_between_forward_and_backward_raises_as_in_torch(name):
    ours_cls, torch_cls, options = OPTIMIZERS[name]
    ours, theirs, x, tx = models()
    for model, opt, inputs in ((ours, ours_cls(ours.parameters(), **options), x),
                               (theirs, torch_cls(theirs.parameters(), **options), tx)):
        model(inputs).sum().backward()  # gradients for the step
        before = [p._version for p in model.parameters()]
        loss = model(inputs).sum()
        opt.step()
        assert all(p._version > v for p, v in zip(model.parameters(), before)), type(opt)
        with pytest.raises(RuntimeError, match=MODIFIED):
            loss.backward()


def test_fused_adamw_kernel_path_counts_its_writes(monkeypatch):
    from neural_arch.backends.kernels import reference
    from neural_arch.optim import fused_adamw
    used = []
    monkeypatch.setattr(fused_adamw, "optimizer_kernels",  # the kernels' references on the CPU
                        lambda array: used.append(array.shape) or reference)
    ours, _, x, _ = models()
    opt = FusedAdamW(ours.parameters(), lr=0.01)
    ours(x).sum().backward()
    loss = ours(x).sum()
    opt.step()
    assert used and all(p._version == 1 for p in ours.parameters())
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()


@pytest.mark.parametrize("name", ["sgd-momentum", "adamw"])
def test_a_training_loop_gives_torchs_losses(name):
    ours_cls, torch_cls, options = OPTIMIZERS[name]
    ours, theirs, x, tx = models(seed=1)
    mine, reference = ours_cls(ours.parameters(), **options), torch_cls(theirs.parameters(),
                                                                        **options)
    for _ in range(4):
        losses = []
        for model, opt, inputs in ((ours, mine, x), (theirs, reference, tx)):
            opt.zero_grad()
            loss = (model(inputs) ** 2).mean()
            loss.backward()
            opt.step()
            losses.append(float(loss.item()))
        np.testing.assert_allclose(losses[0], losses[1], rtol=1e-5)


def test_a_tensor_written_outside_autograd_says_so():
    w = Tensor(np.ones((2, 2)), requires_grad=True)
    loss = (w * w).sum()
    w.array[...] = 3.0  # a write autograd cannot see, as an optimizer's kernel makes
    assert w._version == 0
    w.mark_modified_in_place()
    assert w._version == 1 and w.detach()._version == 1
    with pytest.raises(RuntimeError, match=MODIFIED):
        loss.backward()
