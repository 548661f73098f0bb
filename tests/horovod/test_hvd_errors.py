"""Misuse of ``neural_arch.horovod`` raises errors that name the problem: calls before
``init()``, Adasum and the other Horovod features this package lacks, duplicate or missing
parameter names, a handle synchronized twice, backward passes beyond
``backward_passes_per_step``, ``step()`` in ``skip_synchronize()`` without ``synchronize()``,
ranks that disagree on a shape. Single-process cases run in this
process as a job of one; the rest on 2 ranks."""
from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def hvd(monkeypatch):
    import neural_arch.horovod as hvd
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "HOROVOD_RANK",
                 "HOROVOD_SIZE", "NODE_RANK", "GROUP_RANK"):
        monkeypatch.delenv(name, raising=False)
    hvd.init()
    yield hvd
    hvd.shutdown()


def small_model():
    from neural_arch.models import MLP
    return MLP([3, 4, 2])


def loss_of(model):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    return F.mse_loss(model(Tensor(np.ones((2, 3)))), Tensor(np.zeros((2, 2))))


def test_calls_before_init_raise_like_horovod():
    import neural_arch.horovod as hvd
    from neural_arch.optim import SGD
    assert not hvd.is_initialized()
    for call in (hvd.rank, hvd.size, hvd.local_rank, hvd.cross_size,
                 lambda: hvd.allreduce(np.ones(2)), lambda: hvd.broadcast_object(1),
                 lambda: hvd.DistributedOptimizer(SGD(small_model().parameters()))):
        with pytest.raises(ValueError, match=r"Horovod has not been initialized; use hvd.init\(\)"):
            call()


def test_what_horovod_has_and_this_package_does_not_is_named(hvd):
    from neural_arch.optim import SGD
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.allreduce(np.ones(2), op=hvd.Adasum)
    with pytest.raises(NotImplementedError, match="Adasum"):
        hvd.DistributedOptimizer(SGD(small_model().parameters()), op=hvd.Adasum)
    for name in ("elastic", "ProcessSet", "keras", "tensorflow", "alltoall"):
        with pytest.raises(NotImplementedError, match=name):
            getattr(hvd, name)
    with pytest.raises(NotImplementedError, match="process sets"):
        hvd.allreduce(np.ones(2), process_set=object())
    with pytest.raises(AttributeError, match="no_such_thing"):
        hvd.no_such_thing


def test_argument_errors_name_the_values(hvd):
    from neural_arch.core import Tensor
    with pytest.raises(ValueError, match="supersedes average"):
        hvd.allreduce(np.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(TypeError, match="floating tensor, got dtype int64"):
        hvd.allreduce(np.ones(2, dtype=np.int64))
    with pytest.raises(TypeError, match="NumPy array or a neural_arch Tensor"):
        hvd.allreduce([1.0, 2.0])
    with pytest.raises(ValueError, match=r"root_rank must be a rank in \[0, 1\), got 3"):
        hvd.broadcast(np.ones(2), root_rank=3)
    with pytest.raises(ValueError, match="0-d tensor"):
        hvd.allgather(np.array(1.0))
    handle = hvd.allreduce_async(Tensor(np.ones(2)))
    hvd.synchronize(handle)
    with pytest.raises(ValueError, match="already synchronized"):
        hvd.synchronize(handle)
    with pytest.raises(TypeError, match="needs a handle"):
        hvd.synchronize(np.ones(2))
    assert hvd.join() == 0


def test_name_errors_name_the_values(hvd, monkeypatch):
    with pytest.raises(TypeError, match="name must be a str, got int 3"):
        hvd.allreduce(np.ones(2), name=3)
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "soon")
    with pytest.raises(ValueError, match="HOROVOD_STALL_SHUTDOWN_TIME_SECONDS='soon'"):
        hvd.allreduce_async(np.ones(2), name="x")
    monkeypatch.setenv("HOROVOD_STALL_SHUTDOWN_TIME_SECONDS", "0.5")
    handle = hvd.allgather_async(np.ones((1, 2)), name="x")
    assert "'x'" in repr(handle) and "queued" in repr(handle)
    np.testing.assert_array_equal(hvd.synchronize(handle), np.ones((1, 2)))
    assert hvd.broadcast_object({"k": 1}, name="obj") == {"k": 1}


def test_distributed_optimizer_construction_errors(hvd):
    from neural_arch.optim import SGD
    model = small_model()
    named = list(model.named_parameters())
    with pytest.raises(ValueError, match=f"Found duplicates: {named[0][0]}"):
        hvd.DistributedOptimizer(SGD(model.parameters()),
                                 named_parameters=[named[0], (named[0][0], named[1][1])]
                                 + named[2:])
    with pytest.raises(ValueError, match=r"1 parameters of the optimizer were not named"):
        hvd.DistributedOptimizer(SGD(model.parameters()), named_parameters=named[:-1])
    with pytest.raises(ValueError, match="gradient_predivide_factor=2.0 needs op=hvd.Average"):
        hvd.DistributedOptimizer(SGD(model.parameters()), op=hvd.Sum,
                                 gradient_predivide_factor=2.0)
    with pytest.raises(ValueError, match="backward_passes_per_step must be an int >= 1, got 0"):
        hvd.DistributedOptimizer(SGD(model.parameters()), backward_passes_per_step=0)
    with pytest.raises(TypeError, match="wraps a neural_arch.optim optimizer"):
        hvd.DistributedOptimizer(object())
    opt = hvd.DistributedOptimizer(SGD(model.parameters(), lr=0.1), named_parameters=named)
    with pytest.raises(ValueError, match="already distributed"):
        hvd.DistributedOptimizer(opt)


def test_distributed_optimizer_misuse_during_training(hvd):
    from neural_arch.optim import SGD
    model = small_model()
    opt = hvd.DistributedOptimizer(SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_of(model).backward()
    with pytest.raises(RuntimeError, match=r"more than backward_passes_per_step \(1\) times"):
        loss_of(model).backward()
    opt.synchronize()
    opt.step()
    opt.zero_grad()
    loss_of(model).backward()
    with pytest.raises(RuntimeError, match="skip_synchronize\\(\\) without "
                                           "optimizer.synchronize\\(\\) first"):
        with opt.skip_synchronize():
            opt.step()
    opt.synchronize()
    with pytest.raises(RuntimeError, match="after optimizer.synchronize\\(\\) and before "
                                           "optimizer.step\\(\\)"):
        loss_of(model).backward()


def two_rank_misuse(rank: int, world: int) -> list:
    import neural_arch.horovod as hvd
    from neural_arch.optim import SGD
    hvd.init()
    messages = []
    try:
        hvd.allreduce(np.ones(3 + rank))  # the ranks disagree on the size
    except RuntimeError as exc:
        messages.append(str(exc))
    model = small_model()
    opt = hvd.DistributedOptimizer(SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    loss_of(model).backward()
    try:
        opt.zero_grad()
    except RuntimeError as exc:
        messages.append(str(exc))
    opt.step()
    hvd.shutdown()
    return messages


def test_two_rank_misuse_raises_on_every_rank():
    for messages in run_ranks(two_rank_misuse, 2, "shm", timeout=100):
        assert "ranks disagree on the count of a Horovod operation" in messages[0]
        assert "zero_grad() was called after loss.backward() but before" in messages[1]


def test_importing_neural_arch_does_not_import_horovod():
    code = ("import sys, neural_arch, neural_arch.distributed, neural_arch.nn, "
            "neural_arch.optim; print('neural_arch.horovod' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True)
    assert out.stdout.strip() == "False"
