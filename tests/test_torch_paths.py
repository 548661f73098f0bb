"""torch's import lines map one to one onto ``neural_arch``, and what a ported script then
reaches through ``torch.`` exists (PyTorch's ddp-tutorial-series, multigpu_torchrun.py)."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

import neural_arch as torch  # the way a ported script imports it

pytestmark = pytest.mark.timeout(60)


def test_nn_functional_is_a_module_with_the_functional_api():
    F = importlib.import_module("neural_arch.nn.functional")
    import neural_arch.functional as functional

    assert torch.nn.functional is F
    for name in functional.__all__:
        assert getattr(F, name) is getattr(functional, name), name
    logits = torch.tensor([[2.0, 0.5]], requires_grad=True)
    F.cross_entropy(logits, torch.tensor([0])).backward()
    assert logits.grad.shape == (1, 2)


def test_utils_data_paths():
    from neural_arch.data import DataLoader, Dataset, TensorDataset
    from neural_arch.distributed import DistributedSampler
    from neural_arch.utils.data import DataLoader as UtilsLoader
    from neural_arch.utils.data import Dataset as UtilsDataset
    from neural_arch.utils.data import DistributedSampler as UtilsSampler
    from neural_arch.utils.data import TensorDataset as UtilsTensorDataset
    from neural_arch.utils.data.distributed import DistributedSampler as PathSampler

    assert (UtilsLoader, UtilsDataset, UtilsTensorDataset) == (DataLoader, Dataset, TensorDataset)
    assert UtilsSampler is DistributedSampler and PathSampler is DistributedSampler
    assert torch.utils.data.DataLoader is DataLoader
    sampler = PathSampler(TensorDataset(np.arange(10)), num_replicas=2, rank=1, shuffle=False)
    assert list(sampler) == [1, 3, 5, 7, 9]
    with pytest.raises(AttributeError, match="has no attribute 'Sampler2'"):
        torch.utils.data.Sampler2


def test_nn_parallel_names_the_distributed_data_parallel():
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.nn.parallel import DistributedDataParallel as DDP

    assert DDP is DistributedDataParallel
    assert "DistributedDataParallel" in dir(importlib.import_module("neural_arch.nn.parallel"))


def test_what_the_tutorial_reaches_through_torch_exists():
    for name in ("rand", "randn", "tensor", "zeros", "save", "load", "manual_seed"):
        assert callable(getattr(torch, name)), name
    assert torch.rand(20).shape == (20,)
    assert issubclass(torch.nn.Linear, torch.nn.Module)
    assert issubclass(torch.optim.SGD, torch.optim.Optimizer)
    model = torch.nn.Linear(20, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    assert optimizer.param_groups[0]["lr"] == 1e-3


@pytest.fixture
def one_rank_group(monkeypatch):
    from neural_arch import distributed as dist

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group("gloo", world_size=1, rank=0, timeout=10)
    yield dist
    dist.destroy_process_group()


def test_ddp_accepts_torch_device_arguments(one_rank_group):
    from neural_arch.nn.parallel import DistributedDataParallel as DDP

    model = torch.nn.Linear(3, 2)
    assert DDP(model, device_ids=None, output_device=None).module is model
    assert DDP(model, device_ids=[]).module is model
    with pytest.raises(ValueError, match=r"device_ids=\[0\], output_device=None\): the module "
                                         r"is on the CPU, leave both None"):
        DDP(model, device_ids=[0])
    with pytest.raises(ValueError, match=r"output_device=0\): the module is on the CPU"):
        DDP(model, output_device=0)
