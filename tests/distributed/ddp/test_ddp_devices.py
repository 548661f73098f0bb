"""DistributedDataParallel beyond host parameters: GPU parameters (gradients staged through the
host buckets) and registered buffers, which the first sync takes from rank 0.

GPU parameters run everywhere against ``fake_cupy`` (2 real processes, every backend, so both
the shared-memory buckets and the private ones); with CuPy and a GPU, 2 ranks sharing it train
an MLP and must match one process trained on the concatenated batch on the CPU.
"""
from __future__ import annotations

import numpy as np
import pytest

import fake_cupy
from ddp_cases import STEPS, check_against_reference, ddp_worker, train_reference
from dist_harness import run_ranks
from gpu_testing import needs_gpu, needs_shm

pytestmark = pytest.mark.timeout(180)


def _module_with(params: dict, buffers: dict):
    from neural_arch.nn import Module, Parameter

    class Holder(Module):
        def __init__(self) -> None:
            super().__init__()
            for name, value in params.items():
                setattr(self, name, Parameter(value))
            for name, value in buffers.items():
                self.register_buffer(name, value)

    return Holder()


def _fake_device_ddp(rank: int, world_size: int) -> dict:
    cp = fake_cupy.install()
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    model = _module_with(
        {"w": cp.asarray(np.full((3, 2), rank + 1.0, np.float32)),
         "b": cp.asarray(np.full(5, -rank, np.float64))},
        {"steps": np.full(2, 7 * rank, np.int64), "scale": Tensor(np.full(3, rank + 0.5))})
    ddp = DistributedDataParallel(model, bucket_size_mb=0.00001)  # one bucket per parameter
    out = {"w": cp.asnumpy(model.w.array), "b": cp.asnumpy(model.b.array),
           "steps": model.steps.copy(), "scale": model.scale.array.copy()}
    model.w.grad = cp.asarray(np.arange(6, dtype=np.float32).reshape(3, 2) * (rank + 1))
    model.b.grad = None if rank == 0 else cp.asarray(np.full(5, 4.0))  # rank 0 had none
    ddp.find_unused_parameters = True
    ddp.sync_gradients()
    out["grad_types"] = sorted({type(p.grad.array).__module__ for p in (model.w, model.b)})
    out["w_grad"], out["b_grad"] = cp.asnumpy(model.w.grad.array), cp.asnumpy(model.b.grad.array)
    return out


def test_ddp_stages_device_gradients_and_broadcasts_buffers(backend):
    for got in run_ranks(_fake_device_ddp, 2, backend, timeout=120):
        np.testing.assert_array_equal(got["w"], np.ones((3, 2)))  # rank 0's parameters
        np.testing.assert_array_equal(got["b"], np.zeros(5))
        np.testing.assert_array_equal(got["steps"], [0, 0])  # a NumPy buffer
        np.testing.assert_array_equal(got["scale"], [0.5, 0.5, 0.5])  # a Tensor buffer
        assert got["grad_types"] == ["cupy"]
        np.testing.assert_array_equal(got["w_grad"], np.arange(6).reshape(3, 2) * 1.5)
        np.testing.assert_array_equal(got["b_grad"], np.full(5, 2.0))  # a missing grad adds 0


def _gpu_ddp_worker(rank: int, world_size: int, optimizer_name: str) -> tuple:
    import cupy as cp
    cp.cuda.Device(0).use()
    params, buckets = ddp_worker(rank, world_size, optimizer_name, False, 1)
    assert all(type(p).__module__.startswith("cupy") for p in params), "parameters left the GPU"
    return [cp.asnumpy(p) for p in params], buckets


@needs_gpu
@needs_shm
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_ddp_on_one_gpu_matches_one_process_on_the_cpu(optimizer_name):
    assert STEPS > 1
    results = run_ranks(_gpu_ddp_worker, 2, "shm", timeout=150, args=(optimizer_name,),
                        env={"NEURAL_ARCH_DEVICE": "cuda"})
    check_against_reference(results, train_reference(2, optimizer_name), rtol=1e-7, atol=1e-9)
