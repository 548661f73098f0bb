"""DDP buckets in shared memory: same results as the copy path, failures reported, no leaks."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from ddp_cases import (check_against_reference, make_model, make_optimizer, train_ddp,
                       train_reference)
from dist_harness import RankFailed, run_ranks
from neural_arch.distributed.ddp.shared_segment import ALIGN_BYTES, slices
from repo_paths import REPO_ROOT
from shm_testing import shm_names_of

pytestmark = pytest.mark.timeout(240)


def train_worker(rank: int, world_size: int, shared, auto_sync: bool, micro: int):
    """The training loop of ``ddp_cases``, choosing the bucket storage; also reports which one
    ran."""
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(make_model(seed=rank + 10), auto_sync=auto_sync,
                                    bucket_size_mb=0.0005, shared_buckets=shared)
    opt = make_optimizer("sgd", model.parameters())
    return (train_ddp(model, opt, rank, world_size, micro), model.shared_buckets,
            os.getpid())


def run_training(world_size: int, shared, auto_sync: bool, micro: int = 1):
    results = run_ranks(train_worker, world_size, "shm", timeout=120,
                        args=(shared, auto_sync, micro))
    assert all(r[1] == (shared is not False) for r in results), "wrong bucket storage in use"
    assert shm_names_of(r[2] for r in results) == [], "a shared-memory segment outlived the job"
    return [r[0] for r in results]


@pytest.mark.parametrize("world_size", [2, 3, 4])
@pytest.mark.parametrize("auto_sync", [False, True])
def test_shared_buckets_equal_copy_path_and_single_process(world_size, auto_sync):
    shared = run_training(world_size, None, auto_sync)
    copied = run_training(world_size, False, auto_sync)
    for a, b in zip(shared[0][0], copied[0][0]):
        # both sum in rank order and then divide: the same bits
        assert a.tobytes() == b.tobytes()
    check_against_reference(shared, train_reference(world_size, "sgd"))


@pytest.mark.parametrize("auto_sync", [False, True])
def test_no_sync_accumulation_with_shared_buckets(auto_sync):
    micro = 3
    results = run_training(3, True, auto_sync, micro)
    check_against_reference(results, train_reference(3, "sgd", micro=micro))


def unused_worker(rank: int, world_size: int, shared: bool):
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    from ddp_cases import two_heads

    model = DistributedDataParallel(two_heads(), find_unused_parameters=True,
                                    bucket_size_mb=0.00002, shared_buckets=shared)
    grads = []
    for step in range(2):  # b is used on rank 0 in the first step, on rank 1 in the second
        model.module.zero_grad()
        x = Tensor(np.ones((2, 3), dtype=np.float32) * (rank + 1))
        model(x, use_b=(rank == step)).sum().backward()
        model.sync_gradients()
        m = model.module
        grads.append((m.a.weight.grad.array.copy(), m.b.weight.grad.array.copy(),
                      m.b.bias.grad.array.copy(), m.never.weight.grad, m.never.bias.grad))
    return grads, model.shared_buckets, len(model._buckets)


def test_find_unused_parameters_with_shared_buckets():
    shared = run_ranks(unused_worker, 2, "shm", args=(True,))
    copied = run_ranks(unused_worker, 2, "shm", args=(False,))
    assert [r[1] for r in shared] == [True, True] and shared[0][2] >= 3
    for rank in range(2):
        for step in range(2):
            a, b_weight, b_bias, never_weight, never_bias = shared[rank][0][step]
            assert never_weight is None and never_bias is None
            # rank r feeds rows of (r + 1): a's summed gradient is 2 (r + 1) per entry
            np.testing.assert_array_equal(a, np.full((2, 3), (2 * 1 + 2 * 2) / 2, np.float32))
            used_by = step  # b's only gradient comes from rank `step`, averaged with a zero
            np.testing.assert_array_equal(b_weight, np.full((2, 3), 2 * (used_by + 1) / 2,
                                                            np.float32))
            np.testing.assert_array_equal(b_bias, np.full(2, 2 / 2, np.float32))
            for got, want in zip(shared[rank][0][step][:3], copied[rank][0][step][:3]):
                assert got.tobytes() == want.tobytes()


# ----- large buckets of two dtypes against NumPy -----------------------------------------
SHAPES = [(640, 480), (480,), (3, 1000, 7), (5,), (100, 300)]
DTYPES = [np.float32, np.float32, np.float64, np.float64, np.float32]


def local_grads(rank: int):
    rng = np.random.default_rng(100 + rank)
    return [rng.standard_normal(s).astype(dt) * (rank + 1) for s, dt in zip(SHAPES, DTYPES)]


def large_bucket_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.nn import Module, Parameter

    class Params(Module):
        def __init__(self):
            super().__init__()
            for i, (shape, dt) in enumerate(zip(SHAPES, DTYPES)):
                setattr(self, f"w{i}", Parameter(np.zeros(shape, dt)))

    net = Params()
    model = DistributedDataParallel(net, bucket_size_mb=0.1, shared_buckets=True)
    results = []
    for step in range(2):  # the second sync reuses the arena after release
        for p, g in zip(net.parameters(), local_grads(rank + step)):
            # the second time, gradients of column-major layout are unpacked through a copy
            p.grad = g.copy() if step == 0 else np.asfortranarray(g)
        model.sync_gradients()
        results.append([p.grad.array.copy() for p in net.parameters()])
    return results, len(model._buckets), sorted({b.flat.dtype.name for b in model._buckets})


@pytest.mark.parametrize("world_size", [2, 4])
def test_large_mixed_dtype_buckets_average_exactly(world_size):
    results = run_ranks(large_bucket_worker, world_size, "shm", timeout=120)
    _, buckets, dtypes = results[0]
    assert buckets >= 3 and dtypes == ["float32", "float64"]
    for step in range(2):
        per_rank = [local_grads(r + step) for r in range(world_size)]
        for i, dt in enumerate(DTYPES):
            want = per_rank[0][i] + per_rank[1][i]
            for r in range(2, world_size):
                want = want + per_rank[r][i]
            want = want / dt(world_size)
            for rank in range(world_size):
                got = results[rank][0][step][i]
                assert got.dtype == dt and got.shape == SHAPES[i]
                assert got.tobytes() == want.tobytes(), f"rank {rank} step {step} param {i}"


def slow_rank_worker(rank: int, world_size: int, slow_step: str):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.models import MLP
    net = MLP([64, 64, 8])
    model = DistributedDataParallel(net, bucket_size_mb=0.01, shared_buckets=True)
    if rank == 1:
        # "unpack": reads the results late, while rank 0 already packs the next sync;
        # "_reduce_slice": its slices are final late, while rank 0 wants to unpack them
        original = getattr(model._storage, slow_step)

        def slow(*args):
            time.sleep(0.3)
            original(*args)
        setattr(model._storage, slow_step, slow)
    results = []
    for step in range(3):
        for p in net.parameters():
            p.grad = np.full(p.array.shape, 10.0 * step + rank + 1, np.float32)
        model.sync_gradients()
        results.append([p.grad.array.copy() for p in net.parameters()])
    return results


@pytest.mark.parametrize("slow_step", ["unpack", "_reduce_slice"])
def test_ranks_wait_for_a_slow_peer(slow_step):
    results = run_ranks(slow_rank_worker, 2, "shm", timeout=60, args=(slow_step,))
    for rank, steps in enumerate(results):
        for step, grads in enumerate(steps):
            for g in grads:
                np.testing.assert_array_equal(g, np.full(g.shape, 10.0 * step + 1.5, np.float32),
                                              err_msg=f"rank {rank} step {step}")


# ----- choosing, refusing, falling back --------------------------------------------------
def choice_worker(rank: int, world_size: int, shared, compression: bool = False):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.models import MLP
    flag = shared[rank] if isinstance(shared, tuple) else shared
    model = DistributedDataParallel(MLP([4, 6, 2]), shared_buckets=flag,
                                    gradient_compression=compression)
    return model.shared_buckets


def test_automatic_choice_follows_the_backend():
    assert run_ranks(choice_worker, 2, "shm", args=(None,)) == [True, True]
    assert run_ranks(choice_worker, 2, "tcp", args=(None,)) == [False, False]
    # the float16 hook's buckets are shared too (in float16): asked for or chosen
    assert run_ranks(choice_worker, 2, "shm", args=(None, True)) == [True, True]
    assert run_ranks(choice_worker, 2, "shm", args=(True, True)) == [True, True]
    assert run_ranks(choice_worker, 2, "tcp", args=(None, True)) == [False, False]


@pytest.mark.parametrize("compression", [False, True])
def test_insisting_where_it_cannot_work_raises(compression):
    with pytest.raises(RankFailed, match=r"shared_buckets=True cannot be used: .*not the whole "
                                         r"world of an shm"):
        run_ranks(choice_worker, 2, "tcp", args=(True, compression), timeout=60)


def test_ranks_disagreeing_on_the_flag_are_rejected():
    with pytest.raises(RankFailed, match=r"ValueError: .*shared_buckets.*ranks \[1\] passed "
                                         r"different arguments than rank 0"):
        run_ranks(choice_worker, 2, "shm", args=((True, None),), timeout=60)


def test_flag_must_be_a_bool_or_none():
    with pytest.raises(RankFailed, match=r"TypeError: shared_buckets must be None, True or "
                                         r"False, got 'yes'"):
        run_ranks(choice_worker, 2, "shm", args=("yes",), timeout=60)


def subgroup_worker(rank: int, world_size: int):
    from neural_arch import distributed as dist
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.models import MLP
    group = dist.new_group([0, 1])
    if rank == 2:
        return None
    model = DistributedDataParallel(MLP([4, 6, 2]), group=group)
    return model.shared_buckets


def test_subgroup_keeps_private_buckets():
    assert run_ranks(subgroup_worker, 3, "shm") == [False, False, None]


def no_room_worker(rank: int, world_size: int, shared):
    from neural_arch.distributed.ddp import shared_segment
    if rank == 0:  # as if /dev/shm were full
        shared_segment.create_reserved = lambda name, size: (None, "/dev/shm has no room (test)")
    return choice_worker(rank, world_size, shared)


def test_segment_that_cannot_be_made_falls_back_or_raises_on_every_rank():
    assert run_ranks(no_room_worker, 3, "shm", args=(None,)) == [False, False, False]
    with pytest.raises(RankFailed, match=r"SharedBucketsUnavailable: .*no room \(test\)"):
        run_ranks(no_room_worker, 2, "shm", args=(True,), timeout=60)


def fp16_no_room_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.comm_hooks import fp16_compress_hook
    from neural_arch.distributed.ddp import shared_segment
    from neural_arch.models import MLP
    model = DistributedDataParallel(MLP([4, 6, 2]))
    before = model.shared_buckets
    if rank == 0:  # the float16 segment the hook asks for cannot be made
        shared_segment.create_reserved = lambda name, size: (None, "/dev/shm has no room (test)")
    model.register_comm_hook(None, fp16_compress_hook)
    for p in model.parameters():
        p.grad = np.full(p.array.shape, 1.0 + rank / 3, np.float32)
    model.sync_gradients()
    return (before, model.shared_buckets, sorted({b.flat.dtype.name for b in model._buckets}),
            [p.grad.array.copy() for p in model.parameters()])


def test_float16_segment_that_cannot_be_made_falls_back_to_private_float16_buckets():
    for before, after, wires, grads in run_ranks(fp16_no_room_worker, 2, "shm", timeout=60):
        assert before and not after and wires == ["float16"]
        want = np.float32(np.float16((np.float32(np.float16(1.0)) + np.float32(np.float16(4 / 3)))
                                     / np.float32(2)))
        for g in grads:
            assert g.dtype == np.float32 and (g == want).all(), (g, want)


def skipped_seq_worker(rank: int, world_size: int):
    from neural_arch.distributed import CollectiveMismatchError, DistributedDataParallel
    from neural_arch.distributed.group.world import world
    from neural_arch.models import MLP
    model = DistributedDataParallel(MLP([4, 6, 2]), shared_buckets=True)
    for p in model.parameters():
        p.grad = np.ones(p.array.shape, np.float32)
    if rank == 1:  # as if this rank had issued one collective more than rank 0
        world().default.fingerprint("all_reduce", np.float32, 1)
    try:
        model.sync_gradients()
    except CollectiveMismatchError as exc:
        return exc.rank, exc.peer, exc.op, str(exc)
    return None


def test_ranks_out_of_step_raise_a_mismatch_naming_both():
    results = run_ranks(skipped_seq_worker, 2, "shm", timeout=60)
    for rank, (me, peer, op, message) in enumerate(results):
        assert (me, peer, op) == (rank, 1 - rank, "shared_bucket_all_reduce")
        assert "bucket 0 (" in message and "ranks are out of step" in message


@pytest.mark.timeout(30)
def test_segment_without_room_is_reported_and_removed(monkeypatch):
    import errno

    from neural_arch.distributed.ddp import shared_segment

    def no_space(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(shared_segment.os, "posix_fallocate", no_space)
    name = f"nf_{os.getpid()}_roomtest"
    mm, problem = shared_segment.create_reserved(name, 1 << 20)
    assert mm is None
    assert problem == (f"rank 0 could not reserve {1 << 20} bytes in /dev/shm "
                       f"({os.strerror(errno.ENOSPC)})")
    assert not os.path.exists(f"/dev/shm/{name}")


# ----- a peer killed in the middle of a sync ---------------------------------------------
def killed_peer_worker(rank: int, world_size: int):
    import signal

    from neural_arch.distributed import DistributedDataParallel, PeerFailureError
    from neural_arch.distributed.group.world import world
    from neural_arch.models import MLP
    model = DistributedDataParallel(MLP([16, 32, 32, 4]), bucket_size_mb=0.0002,
                                    shared_buckets=True)
    assert len(model._buckets) >= 3
    arena = model._storage
    pids = list(world().transport.watch.pids)
    if rank == 1:
        reduce_slice = arena._reduce_slice

        def die_in_bucket_one(index, lo, hi):
            if index == 1:  # after arriving at bucket 1's barrier: rank 0 is mid-sync too
                os.kill(os.getpid(), signal.SIGKILL)
            reduce_slice(index, lo, hi)
        arena._reduce_slice = die_in_bucket_one
    for p in model.parameters():
        p.grad = np.ones(p.array.shape, np.float32)
    start = time.monotonic()
    try:
        model.sync_gradients()
    except PeerFailureError as exc:
        return ("PeerFailureError", exc.rank, exc.peer, exc.op, exc.seq,
                time.monotonic() - start, pids, arena.segment_name)
    return ("no error", pids)


def test_killed_peer_during_shared_bucket_sync_is_named():
    results = run_ranks(killed_peer_worker, 2, "shm", timeout=60, may_die=(1,))
    assert results[1] is None
    kind, rank, peer, op, seq, seconds, pids, name = results[0]
    assert (kind, rank, peer, op) == ("PeerFailureError", 0, 1, "shared_bucket_all_reduce")
    assert isinstance(seq, int) and seq > 0
    assert seconds < 10
    assert not os.path.exists(f"/dev/shm/{name}")
    assert shm_names_of(pids) == []


# ----- slices ------------------------------------------------------------------------------
@pytest.mark.timeout(30)
@pytest.mark.parametrize("count", [0, 1, 15, 16, 17, 1000, 123457])
@pytest.mark.parametrize("p", [2, 3, 4, 7])
@pytest.mark.parametrize("itemsize", [2, 4, 8])
def test_slices_tile_the_bucket_on_cache_lines(count, p, itemsize):
    bounds = slices(count, p, itemsize)
    assert len(bounds) == p and bounds[0][0] == 0 and bounds[-1][1] == count
    for (lo, hi), (next_lo, _) in zip(bounds, bounds[1:]):
        assert lo <= hi == next_lo
        assert (hi * itemsize) % ALIGN_BYTES == 0 or hi == count
    widest = max(hi - lo for lo, hi in bounds)
    assert widest <= -(-count // p) + ALIGN_BYTES // itemsize


# ----- the benchmark, end to end with tiny sizes -------------------------------------------
@pytest.mark.timeout(180)
def test_benchmark_reports_consistent_speedups(tmp_path):
    import re
    import subprocess
    import sys
    out = tmp_path / "results.md"
    out.write_text("# Results\n\n<!-- other:start -->\nkept\n<!-- other:end -->\n")
    subprocess.run([sys.executable, str(REPO_ROOT / "benchmarks" / "bench_ddp_buckets.py"),
                    "--models", "20-30-5,40-8", "--world-sizes", "2", "--repeats", "2",
                    "--steps", "2", "--warmup", "1", "--batch", "8", "--output", str(out)],
                   check=True, timeout=150, capture_output=True)
    text = out.read_text()
    assert "<!-- other:start -->\nkept\n<!-- other:end -->" in text
    assert text.count("<!-- bench_ddp_buckets:start -->") == 1
    cells = r"([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)x \|$"
    sync = re.findall(r"^\| (\S+) \(\S+\) \| 2 \| 1 \| " + cells, text, re.MULTILINE)
    step = re.findall(r"^\| 784-1024-1024-10 \(1\.9M\) \| 2 \| (manual|auto) \| 8 \| " + cells,
                      text, re.MULTILINE)
    assert [row[0] for row in sync] == ["20-30-5", "40-8"]
    assert [row[0] for row in step] == ["manual", "auto"]
    waits = re.findall(r"^\| 784-1024-1024-10 \(1\.9M\) \| 2 \| (manual|auto) \| "
                       r"([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", text, re.MULTILINE)
    assert [row[0] for row in waits] == ["manual", "auto"]
    for _, copy_step, copy_wait, shared_step, shared_wait in waits:
        # a step's wait on communication is part of that step, and never nothing
        assert 0 < float(copy_wait) <= float(copy_step)
        assert 0 < float(shared_wait) <= float(shared_step)
    for _, copy, shared, speedup in sync + step:
        assert float(copy) > 0 and float(shared) > 0
        ratio = float(copy) / float(shared)
        # the printed times are rounded to their last digit, the speedup to 0.01
        slack = ratio * (_half_unit(copy) / float(copy) + _half_unit(shared) / float(shared))
        assert abs(float(speedup) - ratio) <= 0.005 + 1.01 * slack


def _half_unit(printed: str) -> float:
    decimals = len(printed.split(".")[1]) if "." in printed else 0
    return 0.5 * 10.0 ** -decimals
