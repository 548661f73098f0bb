"""Communication hooks: exactness of the plain hooks, the error-feedback memory of PowerSGD and
top-k checked on raw numbers every step, and the errors of bad settings.

The memory identity: over the ranks, what a step averaged (world x the result) plus the new
residuals equals the gradients plus the previous residuals. Nothing is lost, only delayed.
"""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import RankFailed, run_ranks

pytestmark = pytest.mark.timeout(240)

SIZES = (16, 12, 10)  # two weight matrices PowerSGD compresses at rank 1 and 2, two biases
STEPS = 6


def _model():
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(3)
    model = MLP(list(SIZES))
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def _state(kind: str, **settings):
    from neural_arch.distributed import comm_hooks as ch
    if kind == "powersgd":
        return ch.PowerSGDState(None, **settings), ch.powerSGD_hook
    if kind == "topk":
        return ch.TopKState(**settings), ch.topk_hook
    if kind == "fp16":
        return ch.CommHookState(), ch.fp16_compress_hook
    return ch.CommHookState(), ch.allreduce_hook


def _residual(state, index):
    found = (state.error_dict if hasattr(state, "error_dict") else state.residuals).get(index)
    return None if found is None else found.copy()


def memory_worker(rank: int, world_size: int, kind: str, settings: dict):
    """Random gradients each step, synchronised explicitly; returns per step and bucket
    (gradient in, previous residual, result, new residual)."""
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(_model(), auto_sync=False, bucket_size_mb=0.001)
    state, hook = _state(kind, **settings)
    log, shapes = [], {}

    def recording(state, bucket):
        index = bucket.index()
        shapes[index] = [g.shape for g in bucket.gradients()]
        assert shapes[index] == [p.array.shape for p in bucket.parameters()]
        before = (index, bucket.buffer().copy(), _residual(state, index))

        def note(future):
            log.append(before + (future.value().copy(), _residual(state, index)))
            return future.value()
        return hook(state, bucket).then(note)

    model.register_comm_hook(state, recording)
    rng = np.random.default_rng(100 + rank)
    for _ in range(STEPS):
        for p in model.module.parameters():
            p.grad = rng.standard_normal(p.array.shape)
        model.sync_gradients()
    return log, [shapes[i] for i in sorted(shapes)], state.last_step_bytes


def _steps(results):
    """Per (step, bucket): every rank's (index, grad, previous residual, result, residual)."""
    logs = [log for log, _, _ in results]
    buckets = len(results[0][1])
    assert buckets > 1 and all(len(log) == STEPS * buckets for log in logs)
    for i in range(STEPS * buckets):
        yield i // buckets, [log[i] for log in logs]


def _check_memory(results, world_size):
    for step, entries in _steps(results):
        grads = sum(g for _, g, _, _, _ in entries)
        previous = sum(r if r is not None else 0 for _, _, r, _, _ in entries)
        result = entries[0][3]
        for _, _, _, other, _ in entries[1:]:
            assert other.tobytes() == result.tobytes(), "ranks must get the same result"
        new = sum(r if r is not None else 0 for _, _, _, _, r in entries)
        np.testing.assert_allclose(world_size * result + new, grads + previous,
                                   rtol=1e-10, atol=1e-10, err_msg=f"step {step}")


@pytest.mark.parametrize("world_size", [2, 3])
def test_powersgd_memory_is_exact_and_low_rank(backend, world_size):
    start, rank = 2, 2
    results = run_ranks(memory_worker, world_size, backend,
                        args=("powersgd", dict(matrix_approximation_rank=rank,
                                               start_powerSGD_iter=start)))
    for step, entries in _steps(results):
        if step >= start:
            continue
        # before start_powerSGD_iter: the plain average, and no residual yet
        exact = sum(g for _, g, _, _, _ in entries) / world_size
        for _, _, previous, result, new in entries:
            np.testing.assert_allclose(result, exact, rtol=1e-12, atol=1e-14)
            assert previous is None and new is None
    _check_memory(results, world_size)
    # after it: each weight gradient is a matrix of rank 2 (12 x 16 and 10 x 12)
    shapes = results[0][1]
    ranks = []
    for step, entries in _steps(results):
        index, result = entries[0][0], entries[0][3]
        at = 0
        for shape in shapes[index]:
            size = int(np.prod(shape))
            if len(shape) == 2 and step >= start:
                ranks.append(np.linalg.matrix_rank(result[at:at + size].reshape(shape), tol=1e-9))
            at += size
    assert ranks == [rank] * 2 * (STEPS - start), ranks
    # bytes: P and Q of each matrix and the biases, not the whole gradient
    dense = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:])) * 8
    compressed = ((12 + 16) * rank + (10 + 12) * rank + 12 + 10) * 8
    assert results[0][2] == compressed < dense


@pytest.mark.parametrize("world_size", [2, 4])
def test_topk_memory_is_exact_and_sparse(backend, world_size):
    ratio = 0.1
    results = run_ranks(memory_worker, world_size, backend, args=("topk", dict(ratio=ratio)))
    _check_memory(results, world_size)
    for _, entries in _steps(results):
        result = entries[0][3]
        k = int(np.ceil(ratio * result.size))
        assert 0 < np.count_nonzero(result) <= world_size * k
        for _, grad, previous, _, new in entries:
            sent = grad + (0 if previous is None else previous) - new
            assert np.count_nonzero(sent) == k  # the k largest, the rest kept back
            assert np.abs(new).max() <= np.abs(sent[sent != 0]).min()


def test_topk_of_everything_is_the_average():
    results = run_ranks(memory_worker, 3, "shm", args=("topk", dict(ratio=1.0)))
    for _, entries in _steps(results):
        exact = sum(g + (0 if r is None else r) for _, g, r, _, _ in entries) / 3
        np.testing.assert_allclose(entries[0][3], exact, rtol=1e-14, atol=1e-15)
        assert all(not new.any() for *_, new in entries)


def _torch_style_hook(state, bucket):
    """PyTorch's own example of a hook: sum, then divide in a then() callback."""
    from neural_arch import distributed as dist
    world = dist.get_world_size()
    return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(
        lambda future: future.value()[0] / world)


def plain_worker(rank: int, world_size: int, kinds: tuple):
    """One synchronised step of random gradients per kind of hook ('none': no hook)."""
    from neural_arch.distributed import DistributedDataParallel
    out = {}
    for kind in kinds:
        model = DistributedDataParallel(_model(), bucket_size_mb=0.001, auto_sync=False)
        if kind == "torch-style":
            model.register_comm_hook(None, _torch_style_hook)
        elif kind != "none":
            model.register_comm_hook(*_state(kind))
        rng = np.random.default_rng(7 + rank)
        for p in model.module.parameters():
            p.grad = rng.standard_normal(p.array.shape) * 10.0 ** rng.integers(-3, 3)
        out["inputs"] = [p.grad.array.copy() for p in model.module.parameters()]
        model.sync_gradients()
        out[kind] = [p.grad.array.copy() for p in model.module.parameters()]
    return out


@pytest.mark.parametrize("world_size", [2, 3])
def test_allreduce_hook_is_bit_identical_and_fp16_within_rounding(backend, world_size):
    results = run_ranks(plain_worker, world_size, backend,
                        args=(("none", "allreduce", "fp16", "torch-style"),))
    magnitude = [sum(np.abs(out["inputs"][i]) for out in results) / world_size
                 for i in range(len(results[0]["inputs"]))]
    for out in results:
        for plain, torch_style in zip(out["none"], out["torch-style"]):
            np.testing.assert_allclose(torch_style, plain, rtol=1e-15, atol=0)
        for plain, hooked, half, size in zip(out["none"], out["allreduce"], out["fp16"],
                                             magnitude):
            assert plain.tobytes() == hooked.tobytes()
            assert half.dtype == np.float64
            np.testing.assert_array_equal(half, half.astype(np.float16))  # went through fp16
            # roundings of the p inputs, the p - 1 additions and the division, each at most
            # 2**-11 relative (2**-25 absolute below float16's normal range)
            rounds = 2 * world_size + 1
            assert np.all(np.abs(half - plain) <= rounds * (2.0 ** -11 * size + 2.0 ** -25))
            assert not np.array_equal(half, plain)


# ----- bad settings and registration ----------------------------------------------------------
@pytest.mark.parametrize("ratio", [0, 0.0, -0.5, 1.5, float("nan"), True])
def test_topk_ratio_outside_zero_one_is_rejected(ratio):
    from neural_arch.distributed.comm_hooks import TopKState
    with pytest.raises(ValueError, match=rf"ratio must be a number in \(0, 1\], got {ratio!r}"):
        TopKState(ratio)


@pytest.mark.parametrize("setting, value", [("matrix_approximation_rank", 0),
                                            ("matrix_approximation_rank", -2),
                                            ("matrix_approximation_rank", 1.5),
                                            ("start_powerSGD_iter", -1)])
def test_powersgd_bad_settings_are_rejected(setting, value):
    from neural_arch.distributed.comm_hooks import PowerSGDState
    with pytest.raises(ValueError, match=rf"{setting} must be an integer >= \d, got {value!r}"):
        PowerSGDState(None, **{setting: value})


def _small_ddp(**kwargs):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.nn import Linear
    return DistributedDataParallel(Linear(3, 2), **kwargs)


def test_registering_twice_or_late_is_rejected(one_rank_group):
    from neural_arch.core import Tensor
    from neural_arch.distributed.comm_hooks import allreduce_hook, fp16_compress_hook
    model = _small_ddp()
    model.register_comm_hook(None, allreduce_hook)
    with pytest.raises(RuntimeError, match=r"register_comm_hook\(fp16_compress_hook\).*already "
                                           r"has the communication hook allreduce_hook"):
        model.register_comm_hook(None, fp16_compress_hook)
    late = _small_ddp()
    late(Tensor(np.ones((1, 3), dtype=np.float32))).sum().backward()
    with pytest.raises(RuntimeError, match=r"register_comm_hook\(allreduce_hook\) must be called "
                                           r"before the first backward"):
        late.register_comm_hook(None, allreduce_hook)
    compressed = _small_ddp(gradient_compression=True)
    with pytest.raises(RuntimeError, match=r"already has the communication hook "
                                           r"fp16_compress_hook"):
        compressed.register_comm_hook(None, allreduce_hook)
    with pytest.raises(TypeError, match=r"hook must be a callable"):
        _small_ddp().register_comm_hook(None, "allreduce")


def bad_result_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.comm_hooks import Future
    from neural_arch.nn import Linear
    model = DistributedDataParallel(Linear(3, 2), auto_sync=False)
    model.register_comm_hook(None, lambda state, bucket: Future.completed(np.zeros(5)))
    for p in model.module.parameters():
        p.grad = np.ones(p.array.shape, dtype=np.float32)
    model.sync_gradients()


def test_a_hook_returning_the_wrong_size_is_named():
    with pytest.raises(RankFailed, match=r"returned 5 values for bucket 0, which holds 8"):
        run_ranks(bad_result_worker, 2, "shm", timeout=60)


def test_future_runs_once_when_waited_and_chains():
    from neural_arch.distributed.comm_hooks import Future
    calls = []
    first = Future(lambda: calls.append("first") or np.arange(3.0))
    second = first.then(lambda f: f.value() * 2)
    assert not first.done() and calls == []
    with pytest.raises(RuntimeError, match=r"value\(\) before the future completed"):
        first.value()
    np.testing.assert_array_equal(second.wait(), [0.0, 2.0, 4.0])
    np.testing.assert_array_equal(second.wait(), [0.0, 2.0, 4.0])
    assert calls == ["first"] and first.done() and second.done()
    failing = Future(lambda: 1 / 0).then(lambda f: f.value())
    for _ in range(2):  # the error is kept, not recomputed
        with pytest.raises(ZeroDivisionError):
            failing.wait()


def mismatch_worker(rank: int, world_size: int):
    from neural_arch.distributed.comm_hooks import allreduce_hook, fp16_compress_hook
    _small_ddp().register_comm_hook(None, fp16_compress_hook if rank else allreduce_hook)


def test_ranks_registering_different_hooks_are_told():
    with pytest.raises(RankFailed, match=r"register_comm_hook\(allreduce_hook\): ranks \[1\] "
                                         r"passed different arguments than rank 0"):
        run_ranks(mismatch_worker, 2, "shm", timeout=60)
