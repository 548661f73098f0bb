"""ZeroRedundancyOptimizer (ZeRO-1) on real processes: DDP + the sharded optimizer against one
process with a plain optimizer on the concatenated batch and against plain DDP, its sharded
state, subgroups, device parameters, added groups, bad input, and
``DistributedTrainingConfig.zero_stage``. Checkpoints: ``test_zero_checkpoints``."""
from __future__ import annotations

import numpy as np
import pytest

import fake_cupy
from ddp_cases import IN, OUT, make_model
from dist_harness import RankFailed, run_ranks
from zero_cases import (ROWS, STEPS, build_model, global_batch, loss_on, make_optimizer,
                        make_scheduler, reference, state_arrays, train)

pytestmark = pytest.mark.timeout(240)


# ----- DDP + ZeRO against the reference and plain DDP ---------------------------------------
def zero_worker(rank: int, world_size: int, model_name: str, optimizer_name: str,
                with_scheduler: bool):
    from neural_arch.distributed import DistributedDataParallel
    results = {}
    for zero in (True, False):
        model = DistributedDataParallel(build_model(model_name))
        opt = make_optimizer(optimizer_name, model.parameters(), zero=zero)
        train(model, opt, model_name, range(STEPS), rank, world_size,
              make_scheduler(opt, with_scheduler))
        params = [p.array.copy() for p in model.module.parameters()]
        index = {id(p): i for i, p in enumerate(model.module.parameters())}
        owned = sorted(index[id(p)] for p in opt.owned_parameters()) if zero else None
        results["zero" if zero else "ddp"] = (params, state_arrays(opt), owned)
    return results


CASES = [  # (world size, model, optimizer, with a scheduler)
    (1, "mlp", "adam", True),
    (2, "mlp", "sgd", True),
    (3, "gpt", "adamw", False),
    (4, "gpt", "sgd", True),
]


@pytest.mark.parametrize("backend_name", ["shm", "tcp"])
@pytest.mark.parametrize("world_size,model_name,optimizer_name,with_scheduler", CASES)
def test_zero_equals_one_process_and_plain_ddp(backend_name, world_size, model_name,
                                               optimizer_name, with_scheduler):
    results = run_ranks(zero_worker, world_size, backend_name,
                        args=(model_name, optimizer_name, with_scheduler), timeout=120)
    want = reference(model_name, optimizer_name, with_scheduler)
    first = results[0]["zero"][0]
    for rank, result in enumerate(results):
        for i, (got, ddp, ours) in enumerate(zip(result["zero"][0], result["ddp"][0], first)):
            assert got.tobytes() == ours.tobytes(), f"rank {rank} parameter {i} differs"
            # the owner does plain DDP's arithmetic on the same averaged gradient
            np.testing.assert_array_equal(got, ddp, err_msg=f"parameter {i} vs plain DDP")
    for got, expected in zip(first, want):
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    # ZeRO-1's point: the shares partition the parameters and each rank keeps only its state
    owned = [r["zero"][2] for r in results]
    assert sorted(i for share in owned for i in share) == list(range(len(first)))
    full_count, full_bytes = results[0]["ddp"][1]
    counts = [r["zero"][1][0] for r in results]
    sizes = [r["zero"][1][1] for r in results]
    assert sum(counts) == full_count and sum(sizes) == full_bytes
    per_param = full_count // len(first)  # state arrays per parameter (1 for SGD, 2 for Adam)
    for share, count in zip(owned, counts):
        assert count == per_param * len(share)
    if world_size > 1:
        assert max(sizes) < full_bytes, f"state bytes per rank {sizes} vs {full_bytes} in all"


def shared_exchange_worker(rank: int, world_size: int):
    """ZeRO and plain DDP from the same weights; after the first step every parameter's
    ``.array`` is rebound to new values (as a model's ``load_state_dict`` may do)."""
    from neural_arch.distributed import DistributedDataParallel
    runs = {}
    for zero in (True, False):
        model = DistributedDataParallel(build_model("mlp"))
        opt = make_optimizer("adam", model.parameters(), zero=zero)
        train(model, opt, "mlp", range(1), rank, world_size)
        for p in model.module.parameters():
            p.array = p.array * 0.5
        train(model, opt, "mlp", range(1, 3), rank, world_size)
        kind = type(opt._exchange).__name__ if zero else None
        runs[zero] = ([p.array.copy() for p in model.module.parameters()], kind)
    return runs


def test_shares_pass_through_shared_memory_on_shm():  # p = 2: the tests above and below
    for rank, runs in enumerate(run_ranks(shared_exchange_worker, 3, "shm", timeout=60)):
        (zero, kind), (ddp, _) = runs[True], runs[False]
        assert kind == "SharedShardExchange", kind  # no all-gather on the whole shm world
        for i, (got, want) in enumerate(zip(zero, ddp)):
            assert got.tobytes() == want.tobytes(), f"rank {rank} parameter {i} differs"


def in_place_worker(rank: int, world_size: int, overlap: bool):
    """Every rank halves its parameters in place right after each step; rank 1 reads the
    owners' updates late. ZeRO through shared memory (after backward, or inside DDP's hook)
    against plain DDP doing the same."""
    import time

    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.comm_hooks import allreduce_hook, hook_with_zero_step
    from neural_arch.distributed.optim.back_to_back import BackToBack
    if rank == 1:
        unpack = BackToBack.unpack_values

        def late(self, flat):
            time.sleep(0.05)
            unpack(self, flat)
        BackToBack.unpack_values = late
    runs = {}
    for zero in (True, False):
        model = DistributedDataParallel(build_model("mlp"), bucket_size_mb=300 / 2 ** 20)
        opt = make_optimizer("adam", model.parameters(), zero=zero,
                             **({"overlap_with_ddp": overlap} if zero else {}))
        if zero and overlap:
            model.register_comm_hook(None, hook_with_zero_step(allreduce_hook, model, opt))
        for step in range(2):
            train(model, opt, "mlp", range(step, step + 1), rank, world_size)
            for p in model.module.parameters():
                p.array *= 0.5
        runs[zero] = [p.array.copy() for p in model.module.parameters()]
    return runs


@pytest.mark.parametrize("overlap", [False, True])
def test_owners_wait_for_their_readers_before_returning(overlap):
    for rank, runs in enumerate(run_ranks(in_place_worker, 2, "shm", args=(overlap,),
                                          timeout=60)):
        for i, (got, want) in enumerate(zip(runs[True], runs[False])):
            assert got.tobytes() == want.tobytes(), f"rank {rank} parameter {i} differs"


def test_a_rank_without_parameters_still_works():
    results = run_ranks(zero_worker, 4, "shm", args=("three", "adam", False), timeout=120)
    owned = [r["zero"][2] for r in results]
    assert sum(1 for share in owned if not share) == 1, owned
    empty = owned.index([])
    assert results[empty]["zero"][1] == (0, 0)
    want = reference("three", "adam", False)
    for result in results:
        for got, expected in zip(result["zero"][0], want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def subgroup_worker(rank: int, world_size: int):
    """Two pairs, (0, 1) and (2, 3), each sharding its optimizer over its own group; every
    rank computes the gradient of the whole batch (no DDP), so each pair trains like one
    process; the pairs train on different batches, so a collective over the wrong ranks
    would show."""
    from neural_arch import distributed as dist
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    pair = pairs[rank // 2]
    model = build_model("mlp")
    opt = make_optimizer("adamw", model.parameters(), zero=True, process_group=pair)
    train(model, opt, "mlp", pair_steps(rank // 2))
    second = 2 * (rank // 2) + 1  # a global rank, as in torch
    opt.consolidate_state_dict(to=second)
    full = opt.state_dict() if rank == second else None
    return [p.array.copy() for p in model.parameters()], full


def pair_steps(pair: int) -> range:
    return range(pair, STEPS + pair)


def test_process_group_subgroups():
    results = run_ranks(subgroup_worker, 4, "shm", timeout=120)
    wants = [reference("mlp", "adamw", False, pair_steps(pair)) for pair in (0, 1)]
    for rank, (params, full) in enumerate(results):
        for got, expected in zip(params, wants[rank // 2]):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)
    for rank in (1, 3):
        assert sorted(results[rank][1]["state"]) == list(range(len(params)))
    assert results[0][1] is None and results[2][1] is None


def device_worker(rank: int, world_size: int):
    """GPU parameters (``fake_cupy``) of two dtypes, staged through the host buffers: a local
    optimizer stamps its parameters with ``rank + 1``; afterwards every rank must hold every
    owner's stamp, still in device arrays."""
    cp = fake_cupy.install()
    from neural_arch import distributed as dist
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.nn import Parameter
    from neural_arch.optim import Optimizer

    class Stamp(Optimizer):
        def __init__(self, params, offset=1.0):
            super().__init__(params, dict(offset=offset))

        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.array[...] = np.full(p.array.shape, dist.get_rank() + group["offset"])

    params = [Parameter(cp.asarray(np.zeros(shape, dtype))) for shape, dtype in
              [((4, 3), np.float32), ((5,), np.float64), ((2, 2), np.float32), ((3,), np.float64),
               ((1,), np.float32)]]
    opt = ZeroRedundancyOptimizer(params, Stamp)
    opt.step()
    owner = {id(p): r for r in range(world_size) for p in opt.owned_parameters(r)}
    return [(type(p.array).__module__, cp.asnumpy(p.array), owner[id(p)]) for p in params]


def test_device_parameters_are_staged_through_the_host():
    results = run_ranks(device_worker, 3, "shm", timeout=60)
    for got in results:
        assert [(module, owner) for module, _, owner in got] == \
            [(module, owner) for module, _, owner in results[0]]
        for module, values, owner in got:
            assert module == "cupy"
            np.testing.assert_array_equal(values, np.full(values.shape, owner + 1.0))
    assert len({owner for _, _, owner in results[0]}) == 3


# ----- add_param_group, bucket views ---------------------------------------------------------
def groups_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    module = build_model("mlp")
    model = DistributedDataParallel(module)
    params = list(module.parameters())
    opt = make_optimizer("sgd", params[:2], zero=True, parameters_as_bucket_view=True)
    before = [id(p) for p in opt.owned_parameters()]
    opt.add_param_group({"params": params[2:], "lr": 0.05})
    kept = set(before) <= {id(p) for p in opt.owned_parameters()}  # no state has to move
    train(model, opt, "mlp", range(STEPS), rank, world_size)
    views = all(p.array.base is not None for p in params)
    return [p.array.copy() for p in params], kept, views, opt.param_groups[1]["momentum"]


def test_add_param_group_and_parameters_as_bucket_view():
    from neural_arch.optim import SGD
    results = run_ranks(groups_worker, 3, "shm", timeout=120)
    model = build_model("mlp")
    params = list(model.parameters())
    opt = SGD([{"params": params[:2]}, {"params": params[2:], "lr": 0.05}], lr=0.1,
              momentum=0.9, nesterov=True, weight_decay=1e-3)
    train(model, opt, "mlp", range(STEPS))
    for got, kept, views, momentum in results:
        assert kept and views and momentum == 0.9
        for a, b in zip(got, params):
            np.testing.assert_allclose(a, b.array, rtol=1e-9, atol=1e-12)


# ----- AdvancedDistributedDataParallel(zero_stage=1) -----------------------------------------
def advanced_worker(rank: int, world_size: int):
    from neural_arch.distributed.ddp import (AdvancedDistributedDataParallel,
                                             DistributedTrainingConfig)
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import Adam
    model = AdvancedDistributedDataParallel(build_model("mlp"),
                                            DistributedTrainingConfig(zero_stage=1))
    try:
        model.backward_step(loss_on(model, "mlp", *global_batch("mlp", 0)), Adam(
            model.parameters(), lr=0.01))
        refused = None
    except TypeError as exc:
        refused = str(exc)
    model.zero_grad()
    opt = model.wrap_optimizer(Adam, lr=0.01)
    wrapped = model.wrap_optimizer(Adam(model.parameters(), lr=0.01))
    for step in range(STEPS):
        x, y = global_batch("mlp", step)
        rows = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
        assert model.backward_step(loss_on(model, "mlp", x[rows], y[rows]), opt)
    kinds = (type(opt) is ZeroRedundancyOptimizer, type(wrapped) is ZeroRedundancyOptimizer)
    return [p.array.copy() for p in model.module.parameters()], refused, kinds


def test_advanced_ddp_zero_stage_1_wraps_the_optimizer():
    results = run_ranks(advanced_worker, 2, "shm", timeout=120)
    want = reference("mlp", "adam", False)
    for params, refused, kinds in results:
        assert "wrap_optimizer" in refused and kinds == (True, True)
        for got, expected in zip(params, want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_zero_stage_is_validated():
    from neural_arch.distributed.ddp import DistributedTrainingConfig
    for bad in (5, -1, 1.0, True, "1"):
        with pytest.raises(ValueError, match=f"zero_stage must be one of.*got {bad!r}"):
            DistributedTrainingConfig(zero_stage=bad)


def staged_worker(rank: int, world_size: int, stage: int):
    """AdvancedDistributedDataParallel at ``stage`` with accumulation over 2 micro-batches and
    clipping; returns the full parameters (gathered at stages 2 and 3) and the gradient norms."""
    from neural_arch.distributed.ddp import (AdvancedDistributedDataParallel,
                                             DistributedTrainingConfig)
    from neural_arch.optim import Adam
    model = AdvancedDistributedDataParallel(build_model("mlp"), DistributedTrainingConfig(
        zero_stage=stage, gradient_accumulation_steps=2, max_grad_norm=0.05))
    opt = model.wrap_optimizer(Adam, lr=0.01)
    if stage >= 2:  # an optimizer over the model's own (unsharded) parameters is refused
        with pytest.raises(ValueError, match="shards"):
            model.wrap_optimizer(Adam(model.module.module.parameters(), lr=0.01))
    for step in range(STEPS):
        x, y = global_batch("mlp", step)
        rows = np.arange(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
        for half in np.array_split(rows, 2):
            model.backward_step(loss_on(model, "mlp", x[half], y[half]), opt)
    state = model.module.full_state_dict() if stage >= 2 else model.module.state_dict()
    return ({k: np.asarray(v).copy() for k, v in state.items()},
            model.get_statistics()["gradient_norms"])


_STAGE_0: list = []  # the stage-0 run both stages are compared with: the same job, run once


def stage_0_run() -> list:
    if not _STAGE_0:
        _STAGE_0.append(run_ranks(staged_worker, 2, "shm", args=(0,), timeout=120))
    return _STAGE_0[0]


@pytest.mark.parametrize("stage", [2, 3])
def test_zero_stages_2_and_3_train_as_stage_0(stage):
    plain = stage_0_run()
    sharded = run_ranks(staged_worker, 2, "tcp", args=(stage,), timeout=120)
    want, want_norms = plain[0]
    assert want_norms["count"] == STEPS and want_norms["max"] > 0.05  # clipping did happen
    for state, norms in sharded:
        assert state.keys() == want.keys()
        for key in want:
            np.testing.assert_allclose(state[key], want[key], rtol=1e-9, atol=1e-12, err_msg=key)
        assert norms["max"] == pytest.approx(want_norms["max"], rel=1e-9)


# ----- bad input ------------------------------------------------------------------------------
def test_optimizer_class_must_be_an_optimizer_subclass():
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import SGD
    params = list(build_model("mlp").parameters())
    for bad in (object, SGD(params, lr=0.1), "SGD"):
        with pytest.raises(TypeError, match="optimizer_class to be an Optimizer subclass"):
            ZeroRedundancyOptimizer(params, bad, lr=0.1)


def mismatch_worker(rank: int, world_size: int):
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import SGD
    model = make_model(seed=1, sizes=(IN, 5 + (rank == 2), OUT))
    ZeroRedundancyOptimizer(model.parameters(), SGD, lr=0.1)


def test_parameters_differing_across_ranks_are_rejected_naming_the_ranks():
    with pytest.raises(RankFailed, match=r"differ across ranks: ranks \[2\].*parameter #0 of "
                                         r"group 0 has shape \(5, 7\).*\(6, 7\) and dtype "
                                         r"float64 on rank 2"):
        run_ranks(mismatch_worker, 3, "shm", timeout=60)
