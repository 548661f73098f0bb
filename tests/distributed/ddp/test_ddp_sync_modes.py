"""DDP's two ways to synchronise, against one process trained on the concatenated batch.

Automatic (the default, PyTorch's semantics): gradients are averaged by the time
``loss.backward()`` returns, and ``sync_gradients()`` after it does nothing. Explicit
(``auto_sync=False``): a forward or a second backward after gradients that were never
synchronised raises, naming what was forgotten.
"""
from __future__ import annotations

import re

import numpy as np
import pytest

from conftest import BACKENDS
from ddp_cases import (check_against_reference, ddp_worker, make_model, rank_share,
                       train_reference, two_heads)
from dist_harness import RankFailed, run_ranks

pytestmark = pytest.mark.timeout(240)

SOCKET_BACKENDS = [b for b in ("shm", "tcp") if b in BACKENDS]
SIZES = [2, 3]


def reference_gradients(world_size: int):
    """One process, the whole first batch, rank 0's initial weights."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from ddp_cases import batches
    model = make_model(seed=10)
    xs, ys = batches(world_size)
    F.cross_entropy(model(Tensor(xs[0])), Tensor(ys[0])).backward()
    return [p.grad.array.copy() for p in model.parameters()]


def backward_then_sync_worker(rank: int, world_size: int):
    """One backward without any sync call, then ``sync_gradients()``; the collectives each ran
    are counted by a tracer."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.profiler import CommunicationProfiler, trace_collectives
    model = DistributedDataParallel(make_model(seed=rank + 10), bucket_size_mb=0.0005)
    x, y = rank_share(0, rank, world_size)
    loss = F.cross_entropy(model(Tensor(x)), Tensor(y))
    with trace_collectives(CommunicationProfiler()) as during_backward:
        loss.backward()
    grads = [p.grad.array for p in model.module.parameters()]
    after_backward = [g.copy() for g in grads]
    with trace_collectives(CommunicationProfiler()) as during_sync:
        model.sync_gradients()
    same_arrays = all(p.grad.array is g for p, g in zip(model.module.parameters(), grads))
    return (after_backward, [p.grad.array.copy() for p in model.module.parameters()], same_arrays,
            len(during_backward.events()), len(during_sync.events()), len(model._buckets))


@pytest.mark.parametrize("backend", SOCKET_BACKENDS)
@pytest.mark.parametrize("world_size", SIZES)
def test_default_mode_averages_by_the_end_of_backward(backend, world_size):
    results = run_ranks(backward_then_sync_worker, world_size, backend)
    want = reference_gradients(world_size)
    for after_backward, *_ in results:
        for got, first in zip(after_backward, results[0][0]):
            assert got.tobytes() == first.tobytes(), "ranks must hold bit-identical gradients"
        for got, expected in zip(after_backward, want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    # and trained for several steps without a single sync_gradients() call
    trained = run_ranks(ddp_worker, world_size, backend, args=("sgd", True, 1, False))
    check_against_reference(trained, train_reference(world_size, "sgd"))


@pytest.mark.parametrize("backend", SOCKET_BACKENDS)
@pytest.mark.parametrize("world_size", SIZES)
def test_sync_gradients_after_an_averaging_backward_is_a_no_op(backend, world_size):
    results = run_ranks(backward_then_sync_worker, world_size, backend)
    for after_backward, after_sync, same_arrays, in_backward, in_sync, buckets in results:
        assert in_backward >= buckets > 1, "the buckets are all-reduced during backward"
        assert in_sync == 0, f"sync_gradients() ran {in_sync} collectives after backward"
        assert same_arrays
        for a, b in zip(after_backward, after_sync):
            assert a.tobytes() == b.tobytes()


def forgotten_sync_worker(rank: int, world_size: int, then: str):
    """Explicit mode: what is allowed (accumulating in no_sync, syncing), then a forgotten
    sync followed by ``then`` ("forward" or "backward")."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(make_model(seed=rank + 10), auto_sync=False)
    x, y = (Tensor(a) for a in rank_share(0, rank, world_size))
    with model.no_sync():
        F.cross_entropy(model(x), y).backward()
        F.cross_entropy(model(x), y).backward()
    F.cross_entropy(model(x), y).backward()
    model.sync_gradients()
    first, second = F.cross_entropy(model(x), y), F.cross_entropy(model(x), y)
    first.backward()  # never synced
    if then == "forward":
        model(x)
    else:
        second.backward()


@pytest.mark.parametrize("backend", SOCKET_BACKENDS)
@pytest.mark.parametrize("world_size", SIZES)
@pytest.mark.parametrize("then, named", [("forward", r"forward\(\)"),
                                         ("backward", r"a second backward\(\)")])
def test_explicit_mode_detects_a_forgotten_sync(backend, world_size, then, named):
    pattern = (rf"RuntimeError: DistributedDataParallel\(auto_sync=False\): {named} after a "
               rf"backward\(\) whose gradients \(6 parameters, the first '.*'\) were never "
               rf"averaged over the {world_size} ranks.*call sync_gradients\(\)")
    with pytest.raises(RankFailed, match=pattern):
        run_ranks(forgotten_sync_worker, world_size, backend, args=(then,), timeout=60)


@pytest.mark.parametrize("backend", SOCKET_BACKENDS)
@pytest.mark.parametrize("world_size", SIZES)
def test_no_sync_accumulation_without_sync_calls(backend, world_size):
    micro = 3  # two micro-batches inside no_sync, the third backward averages all three
    results = run_ranks(ddp_worker, world_size, backend, args=("sgd", True, micro, False))
    check_against_reference(results, train_reference(world_size, "sgd", micro=micro))


def unused_worker(rank: int, world_size: int):
    """Head ``b`` is used on one rank per step, ``never`` on none; no sync_gradients() call.
    Tiny buckets: ``never``'s bucket gets no gradient and is launched at the end of backward."""
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(two_heads(), find_unused_parameters=True,
                                    bucket_size_mb=0.00002)
    grads = []
    for step in range(2):
        model.module.zero_grad()
        x = Tensor(np.ones((2, 3), dtype=np.float32) * (rank + 1))
        model(x, use_b=(rank == step)).sum().backward()
        m = model.module
        grads.append((m.a.weight.grad.array.copy(), m.b.weight.grad.array.copy(),
                      m.never.weight.grad, m.never.bias.grad))
    return grads, len(model._buckets)


@pytest.mark.parametrize("backend", SOCKET_BACKENDS)
@pytest.mark.parametrize("world_size", SIZES)
def test_unused_parameters_in_default_mode(backend, world_size):
    results = run_ranks(unused_worker, world_size, backend)
    assert results[0][1] >= 3
    mean_rows = sum(r + 1 for r in range(world_size)) / world_size
    for grads, _ in results:
        for step, (a, b, never_weight, never_bias) in enumerate(grads):
            assert never_weight is None and never_bias is None
            # rank r feeds two rows of (r + 1); b's only gradient comes from rank `step`
            np.testing.assert_allclose(a, np.full((2, 3), 2 * mean_rows), rtol=1e-6)
            np.testing.assert_allclose(b, np.full((2, 3), 2 * (step + 1) / world_size),
                                       rtol=1e-6)


def failing_callback_worker(rank: int, world_size: int, failure: str):
    """The end-of-backward callback fails: a parameter without gradient (and no
    find_unused_parameters), or an injected error while unpacking the averages."""
    from neural_arch.core import Tensor, autograd
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(two_heads(), find_unused_parameters=failure == "unpack")
    if failure == "unpack":
        def unpack(index, *args):
            raise ValueError(f"unpacking bucket {index} failed on rank {rank}")
        model._storage.unpack = unpack
    x = Tensor(np.ones((2, 3), dtype=np.float32))
    loss = model(x, use_b=True).sum()
    try:
        loss.backward()
    except Exception as exc:  # noqa: BLE001 - the test wants to see what came out of backward
        leftover = autograd.current_backward()
        (Tensor(np.ones(2), requires_grad=True) * 2).sum().backward()  # the engine still works
        return type(exc).__name__, str(exc), leftover
    return None


@pytest.mark.parametrize("backend", SOCKET_BACKENDS)
@pytest.mark.parametrize("world_size", SIZES)
@pytest.mark.parametrize("failure, error, text", [
    ("unused", "RuntimeError",
     r"received no gradient this step: \[[^]]*'never\.weight'.*find_unused_parameters=True"),
    ("unpack", "ValueError", r"unpacking bucket 0 failed on rank \d")])
def test_failure_in_the_end_of_backward_callback_propagates(backend, world_size, failure,
                                                             error, text):
    results = run_ranks(failing_callback_worker, world_size, backend, args=(failure,),
                        timeout=60)
    for rank, result in enumerate(results):
        assert result is not None, f"rank {rank}: backward() returned without the error"
        kind, message, leftover = result
        assert kind == error and leftover is None
        assert re.search(text, message), message
