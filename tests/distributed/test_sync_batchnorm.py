"""``nn.SyncBatchNorm`` on real processes against one process holding the whole batch.

Each rank holds a slice of one global batch (uneven slices, an empty one too); the outputs and
input gradients, concatenated in rank order, the weight and bias gradients summed over the
ranks, and the running statistics after a few steps must equal plain BatchNorm over the whole
batch in one process. Evaluation issues no collective, and ``convert_sync_batchnorm`` swaps
every BatchNorm of a model tree keeping its state.
"""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)

STEPS = 3
CHANNELS = 3


def _global_batch(step: int, rows: int, tail: tuple, dtype) -> tuple:
    rng = np.random.default_rng(100 + step)
    x = rng.normal(1.5, 2.0, size=(rows, CHANNELS) + tail).astype(dtype)
    upstream = rng.normal(size=x.shape).astype(dtype)  # d(loss)/d(out), not uniform
    return x, upstream


def _affine(module, dtype) -> None:
    rng = np.random.default_rng(7)
    module.weight.array[...] = rng.uniform(0.5, 1.5, CHANNELS).astype(dtype)
    module.bias.array[...] = rng.normal(size=CHANNELS).astype(dtype)


def _train(module, batches, dtype) -> dict:
    """Run the steps on ``batches`` (x, upstream) and collect what each step produced."""
    from neural_arch.core import Tensor
    _affine(module, dtype)
    record = {"out": [], "x_grad": [], "w_grad": [], "b_grad": []}
    for x_data, upstream in batches:
        module.weight.grad = module.bias.grad = None
        x = Tensor(x_data, requires_grad=True)
        out = module(x)
        (out * Tensor(upstream)).sum().backward()
        record["out"].append(out.array.copy())
        record["x_grad"].append(x.grad.array.copy())
        record["w_grad"].append(module.weight.grad.array.copy())
        record["b_grad"].append(module.bias.grad.array.copy())
    record["running"] = (module.running_mean.array.copy(), module.running_var.array.copy(),
                         int(module.num_batches_tracked.array))
    return record


def sync_worker(rank: int, world_size: int, sizes: tuple, tail: tuple, dtype_name: str):
    from neural_arch import nn
    dtype = np.dtype(dtype_name)
    start, stop = sum(sizes[:rank]), sum(sizes[:rank + 1])
    batches = [tuple(a[start:stop] for a in _global_batch(s, sum(sizes), tail, dtype))
               for s in range(STEPS)]
    return _train(nn.SyncBatchNorm(CHANNELS, dtype=dtype), batches, dtype)


def _reference(sizes: tuple, tail: tuple, dtype) -> dict:
    from neural_arch import nn
    layer = nn.BatchNorm2d if len(tail) == 2 else nn.BatchNorm1d
    batches = [_global_batch(s, sum(sizes), tail, dtype) for s in range(STEPS)]
    return _train(layer(CHANNELS, dtype=dtype), batches, dtype)


@pytest.mark.parametrize("backend_name, sizes, tail, dtype_name, tol", [
    ("shm", (3, 5), (2, 3), "float64", 1e-11),
    ("shm", (3, 5, 2), (2, 3), "float64", 1e-11),
    ("tcp", (3, 5, 2), (2, 3), "float64", 1e-11),
    ("shm", (4, 0, 3), (2, 2), "float64", 1e-11),  # a rank with an empty batch
    ("tcp", (2, 1), (), "float32", 2e-5),  # (N, C) input; one row on a rank
])
def test_matches_one_process_over_the_whole_batch(backend_name, sizes, tail, dtype_name, tol):
    results = run_ranks(sync_worker, len(sizes), backend_name, args=(sizes, tail, dtype_name))
    want = _reference(sizes, tail, np.dtype(dtype_name))
    for step in range(STEPS):
        for key in ("out", "x_grad"):
            got = np.concatenate([r[key][step] for r in results])
            np.testing.assert_allclose(got, want[key][step], rtol=tol, atol=tol,
                                       err_msg=f"{key} at step {step}")
        for key in ("w_grad", "b_grad"):  # local on each rank; DDP adds them up
            got = sum(r[key][step] for r in results)
            np.testing.assert_allclose(got, want[key][step], rtol=tol, atol=tol,
                                       err_msg=f"{key} at step {step}")
    for r in results:
        for got, expected in zip(r["running"], want["running"]):
            np.testing.assert_allclose(got, expected, rtol=tol, atol=tol)


def subgroup_worker(rank: int, world_size: int):
    """Ranks 0 and 2 synchronise over their own group; rank 1 trains alone meanwhile."""
    from neural_arch import distributed as dist
    from neural_arch import nn
    group = dist.new_group([0, 2])
    dtype = np.dtype(np.float64)
    sizes = {0: slice(0, 3), 2: slice(3, 7)}  # the two members' slices of one 7-row batch
    if rank not in sizes:
        batches = [_global_batch(s, 5, (2, 2), dtype) for s in range(STEPS)]
        result = _train(nn.BatchNorm2d(CHANNELS, dtype=dtype), batches, dtype)
    else:
        batches = [tuple(a[sizes[rank]] for a in _global_batch(s, 7, (2, 2), dtype))
                   for s in range(STEPS)]
        layer = nn.SyncBatchNorm(CHANNELS, process_group=group, dtype=dtype)
        result = _train(layer, batches, dtype)
    # a collective of the members on the whole world would meet this one and fail, not hang
    dist.all_reduce(np.ones(1))
    return result


def test_process_group_limits_the_synchronisation_to_its_ranks():
    results = run_ranks(subgroup_worker, 3, "shm")
    want = _reference((3, 4), (2, 2), np.dtype(np.float64))
    for step in range(STEPS):
        got = np.concatenate([results[0]["x_grad"][step], results[2]["x_grad"][step]])
        np.testing.assert_allclose(got, want["x_grad"][step], rtol=1e-11, atol=1e-11)
        got = np.concatenate([results[0]["out"][step], results[2]["out"][step]])
        np.testing.assert_allclose(got, want["out"][step], rtol=1e-11, atol=1e-11)
    for got, expected in zip(results[2]["running"], want["running"]):
        np.testing.assert_allclose(got, expected, rtol=1e-11, atol=1e-11)


def eval_worker(rank: int, world_size: int):
    """Rank 0 alone runs evaluation forwards; then both ranks all-reduce a marker. A
    collective in evaluation would meet the marker's all-reduce and fail the fingerprint check."""
    from neural_arch import distributed as dist
    from neural_arch import nn
    from neural_arch.core import Tensor
    x = np.random.default_rng(rank).normal(size=(4, CHANNELS, 2, 2))
    outputs = None
    if rank == 0:
        sync, plain = nn.SyncBatchNorm(CHANNELS), nn.BatchNorm2d(CHANNELS)
        for layer in (sync, plain):
            layer.running_mean.array[...] = [0.5, -1.0, 2.0]
            layer.running_var.array[...] = [2.0, 0.5, 1.5]
            layer.eval()
        no_stats = nn.SyncBatchNorm(CHANNELS, track_running_stats=False).eval()
        plain_no_stats = nn.BatchNorm2d(CHANNELS, track_running_stats=False).eval()
        outputs = [(sync(Tensor(x)).array, plain(Tensor(x)).array),
                   (no_stats(Tensor(x)).array, plain_no_stats(Tensor(x)).array)]
    marker = np.array([rank + 1.0])
    dist.all_reduce(marker)
    return outputs, float(marker[0])


def test_evaluation_issues_no_collective():
    results = run_ranks(eval_worker, 2, "shm", timeout=60)
    assert [r[1] for r in results] == [3.0, 3.0]
    for got, want in results[0][0]:
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def _sync_and_plain_steps():
    from neural_arch import nn
    sizes, tail, dtype = (6,), (2, 2), np.dtype(np.float64)
    batches = [_global_batch(s, 6, tail, dtype) for s in range(STEPS)]
    layer = nn.SyncBatchNorm(CHANNELS, dtype=dtype)
    return _train(layer, batches, dtype), _reference(sizes, tail, dtype)


def _assert_same(got: dict, want: dict) -> None:
    for key in ("out", "x_grad", "w_grad", "b_grad"):
        for a, b in zip(got[key], want[key]):
            np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, err_msg=key)
    for a, b in zip(got["running"], want["running"]):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_one_rank_group_and_no_group_are_plain_batchnorm(one_rank_group):
    _assert_same(*_sync_and_plain_steps())


def test_without_a_process_group_it_is_plain_batchnorm():
    from neural_arch import distributed as dist
    assert not dist.is_initialized()
    _assert_same(*_sync_and_plain_steps())


def test_input_checks_name_the_shape():
    from neural_arch import nn
    layer = nn.SyncBatchNorm(CHANNELS)
    with pytest.raises(ValueError, match=r"SyncBatchNorm.*\(3,\)"):
        layer(np.zeros(3, dtype=np.float32))
    with pytest.raises(ValueError, match="num_features=3"):
        layer(np.zeros((2, 4, 2), dtype=np.float32))
