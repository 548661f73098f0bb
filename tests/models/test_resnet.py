"""The CIFAR ResNet against the same architecture built in torch with copied weights (the
torch twin is ``benchmarks/resnet_twin.py``, which the convolution benchmark uses too)."""
import sys

import numpy as np
import pytest

from neural_arch import functional as F
from neural_arch.core import Tensor, manual_seed
from neural_arch.models import ResNet, resnet8, resnet20
from neural_arch.optim import SGD
from repo_paths import REPO_ROOT

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
from resnet_twin import load_our_state, torch_resnet  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def _twins(torch, block_counts=(1, 1, 1), widths=(16, 32, 64), dtype=np.float64):
    manual_seed(0)
    ours = ResNet(block_counts, widths, num_classes=10, dtype=dtype)
    theirs = torch_resnet(torch, block_counts, widths, 10).to(getattr(torch, np.dtype(dtype).name))
    load_our_state(torch, theirs, ours.state_dict(), "resnet")
    return ours, theirs


def _batch(seed, dtype, n=4, size=32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, 3, size, size)).astype(dtype), rng.integers(0, 10, n)


def test_resnet_forward_backward_matches_torch():
    torch = pytest.importorskip("torch")
    ours, theirs = _twins(torch)
    x, y = _batch(1, np.float64)
    loss = F.cross_entropy(ours(x), y)
    loss.backward()
    tloss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)), torch.from_numpy(y))
    tloss.backward()
    assert abs(loss.item() - tloss.item()) < 1e-10
    theirs_params = dict(theirs.named_parameters())
    for name, p in ours.named_parameters():
        np.testing.assert_allclose(p.grad, theirs_params[name].grad.numpy(), rtol=1e-7,
                                   atol=1e-10, err_msg=name)
    for key, value in theirs.state_dict().items():  # running statistics after the step
        np.testing.assert_allclose(ours.state_dict()[key], value.numpy(), rtol=1e-10,
                                   err_msg=key)
    ours.eval(), theirs.eval()
    np.testing.assert_allclose(ours(x).array, theirs(torch.from_numpy(x)).detach().numpy(),
                               rtol=1e-9, atol=1e-10)


def test_resnet_sgd_steps_track_torch_losses():
    torch = pytest.importorskip("torch")
    ours, theirs = _twins(torch, block_counts=(1, 1), widths=(8, 16), dtype=np.float32)
    opt = SGD(ours.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    topt = torch.optim.SGD(theirs.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    losses, tlosses = [], []
    for step in range(4):
        x, y = _batch(10 + step, np.float32, n=8, size=16)
        loss = F.cross_entropy(ours(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        tloss = torch.nn.functional.cross_entropy(theirs(torch.from_numpy(x)),
                                                  torch.from_numpy(y))
        topt.zero_grad()
        tloss.backward()
        topt.step()
        losses.append(loss.item())
        tlosses.append(tloss.item())
    np.testing.assert_allclose(losses, tlosses, rtol=1e-4)
    assert losses[0] != losses[-1]


def test_resnet_shapes_and_errors():
    model = resnet8(num_classes=7)
    assert model(np.zeros((2, 3, 32, 32), np.float32)).shape == (2, 7)
    assert sum(1 for name, _ in model.named_parameters() if name.endswith("conv1.weight")) == 4
    deep = resnet20()
    assert len(deep.layer3) == 3 and deep.layer2[0].downsample is not None
    assert deep.layer2[1].downsample is None
    with pytest.raises(ValueError, match="one positive block count per positive width"):
        ResNet((1, 1), (16, 32, 64))
    assert isinstance(model(Tensor(np.zeros((1, 3, 32, 32), np.float32))), Tensor)
