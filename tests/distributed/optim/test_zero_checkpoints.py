"""ZeroRedundancyOptimizer checkpoints on real processes: ``consolidate_state_dict`` then
``state_dict`` on one rank, loading into a plain optimizer and into another world size, through
``DistributedCheckpointManager`` too; and ``gather_object``, which the consolidation uses."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from zero_cases import (STEPS, build_model, make_optimizer, make_scheduler, reference,
                        state_arrays, train)

pytestmark = pytest.mark.timeout(240)


SPLIT = 3  # steps before the checkpoint


def checkpoint_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(build_model("mlp"))
    opt = make_optimizer("adam", model.parameters(), zero=True)
    scheduler = make_scheduler(opt, True)
    errors = []

    def state_dict_error():
        try:
            opt.state_dict()
        except RuntimeError as exc:
            return str(exc)
        return None
    errors.append(state_dict_error())  # nothing consolidated yet
    train(model, opt, "mlp", range(SPLIT), rank, world_size, scheduler)
    opt.consolidate_state_dict(to=0)
    full = opt.state_dict() if rank == 0 else None
    errors.append(state_dict_error() if rank != 0 else "rank 0 has it")
    params = [p.array.copy() for p in model.module.parameters()]
    train(model, opt, "mlp", range(SPLIT, SPLIT + 1), rank, world_size, scheduler)
    errors.append(state_dict_error())  # stale after a step
    return full, scheduler.state_dict(), params, errors


def resume_worker(rank: int, world_size: int, full, scheduler_state, params):
    from neural_arch.distributed import DistributedDataParallel
    module = build_model("mlp")
    for p, value in zip(module.parameters(), params):
        p.array = value.copy()
    model = DistributedDataParallel(module)
    opt = make_optimizer("adam", model.parameters(), zero=True)
    scheduler = make_scheduler(opt, True)  # before loading: it resets the learning rates
    opt.load_state_dict(full)
    scheduler.load_state_dict(scheduler_state)
    counts = state_arrays(opt)[0], 2 * len(opt.owned_parameters())
    train(model, opt, "mlp", range(SPLIT, STEPS), rank, world_size, scheduler)
    return [p.array.copy() for p in module.parameters()], counts


def test_consolidated_state_dict_resumes_in_a_plain_optimizer_and_at_another_world_size():
    results = run_ranks(checkpoint_worker, 2, "shm", timeout=120)
    full, scheduler_state, params, errors = results[0]
    assert "consolidate_state_dict" in errors[0] and "rank 0" in errors[0]
    assert "consolidate_state_dict" in results[1][3][1]  # rank 1 never holds the full state
    assert "consolidate_state_dict" in errors[2]
    assert sorted(full["state"]) == list(range(len(params)))
    assert all(s["step"] == SPLIT for s in full["state"].values())
    want = reference("mlp", "adam", True)

    # into a plain optimizer on one process
    from neural_arch.optim import StepLR
    model = build_model("mlp")
    for p, value in zip(model.parameters(), params):
        p.array = value.copy()
    opt = make_optimizer("adam", model.parameters())
    scheduler = StepLR(opt, step_size=2, gamma=0.5)
    opt.load_state_dict(full)
    scheduler.load_state_dict(scheduler_state)
    train(model, opt, "mlp", range(SPLIT, STEPS), scheduler=scheduler)
    for got, expected in zip(model.parameters(), want):
        np.testing.assert_allclose(got.array, expected, rtol=1e-9, atol=1e-12)

    # into ZeroRedundancyOptimizers at world size 3: each keeps its share's entries only
    resumed = run_ranks(resume_worker, 3, "tcp", args=(full, scheduler_state, params),
                        timeout=120)
    for got_params, (count, expected_count) in resumed:
        assert count == expected_count
        for got, expected in zip(got_params, want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def manager_worker(rank: int, world_size: int, directory: str, resume: bool):
    """Save with ``DistributedCheckpointManager`` after ``SPLIT`` steps, or resume from that
    checkpoint and finish training."""
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    model = DistributedDataParallel(build_model("mlp"))
    opt = make_optimizer("adam", model.parameters(), zero=True)
    scheduler = make_scheduler(opt, True)
    manager = DistributedCheckpointManager(directory)
    if resume:
        manager.load_checkpoint(model.module, opt, scheduler=scheduler)
        train(model, opt, "mlp", range(SPLIT, STEPS), rank, world_size, scheduler)
        return [p.array.copy() for p in model.module.parameters()]
    train(model, opt, "mlp", range(SPLIT), rank, world_size, scheduler)
    opt.consolidate_state_dict(to=0)  # rank 0 writes the checkpoint
    manager.save_checkpoint(model.module, opt, epoch=0, step=SPLIT, loss=None,
                            scheduler=scheduler)
    return None


def test_checkpoint_manager_saves_the_full_state_and_resumes_at_another_world_size(tmp_path):
    run_ranks(manager_worker, 2, "shm", args=(str(tmp_path), False), timeout=120)
    resumed = run_ranks(manager_worker, 3, "shm", args=(str(tmp_path), True), timeout=120)
    want = reference("mlp", "adam", True)
    for params in resumed:
        for got, expected in zip(params, want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


# ----- gather_object, which consolidate_state_dict uses ----------------------------------------
def gather_worker(rank: int, world_size: int):
    from neural_arch import distributed as dist
    got = dist.gather_object({"rank": rank, "payload": "x" * (10 * rank)}, dst=1)
    into = [None] * world_size if rank == 0 else None
    dist.gather_object(rank * 2, into, dst=0)
    misuse = None
    if rank != 0:  # a list off dst is refused before anything is sent
        try:
            dist.gather_object(rank, [None] * world_size, dst=0)
        except ValueError as exc:
            misuse = str(exc)
    return got, into, misuse


def test_gather_object_reaches_only_dst():
    results = run_ranks(gather_worker, 3, "tcp", timeout=60)
    assert results[0][0] is None and results[2][0] is None
    assert results[1][0] == [{"rank": r, "payload": "x" * (10 * r)} for r in range(3)]
    assert results[0][1] == [0, 2, 4] and results[1][1] is None
    assert results[0][2] is None and "must be None on rank 2" in results[2][2]


def test_one_rank_state_dict_equals_the_plain_optimizers(one_rank_group):
    """On one rank the wrapper is the plain optimizer plus bookkeeping: same steps, same dict."""
    zero_model, plain_model = build_model("mlp"), build_model("mlp")
    zero = make_optimizer("adamw", zero_model.parameters(), zero=True)
    plain = make_optimizer("adamw", plain_model.parameters())
    train(zero_model, zero, "mlp", range(2))
    train(plain_model, plain, "mlp", range(2))
    unconsolidated = zero.state_dict()  # one rank holds the whole state: allowed
    zero.consolidate_state_dict()
    got, want = zero.state_dict(), plain.state_dict()
    assert sorted(unconsolidated["state"]) == sorted(want["state"])
    assert got["param_groups"] == want["param_groups"]
    assert sorted(got["state"]) == sorted(want["state"])
    for index, entry in want["state"].items():
        for key, value in entry.items():
            np.testing.assert_array_equal(got["state"][index][key], value)
