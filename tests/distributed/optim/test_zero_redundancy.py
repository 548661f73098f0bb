"""ZeroRedundancyOptimizer (ZeRO-1) on real processes: DDP + the sharded optimizer against one
process with a plain optimizer on the concatenated batch, against plain DDP, and its
checkpoints; plus ``DistributedTrainingConfig.zero_stage``."""
from __future__ import annotations

import numpy as np
import pytest

import fake_cupy
from ddp_cases import IN, OUT, make_model
from dist_harness import RankFailed, run_ranks

pytestmark = pytest.mark.timeout(240)

STEPS, ROWS, BLOCK, VOCAB = 5, 12, 8, 11  # ROWS: the global batch, divisible by 1, 2, 3, 4


# ----- models, data, one step -------------------------------------------------------------
def build_model(name: str):
    """The same weights for every call (DDP would broadcast rank 0's anyway), float64."""
    if name == "mlp":
        return make_model(seed=10)
    from neural_arch.core import manual_seed
    from neural_arch.models import GPT, GPTConfig
    from neural_arch.nn import Linear, Module
    manual_seed(11)
    if name == "gpt":
        model = GPT(GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=2,
                              n_embd=16))
    else:  # "three": three parameters, so a fourth rank owns none

        class Three(Module):
            def __init__(self):
                super().__init__()
                self.a = Linear(IN, 5)
                self.b = Linear(5, OUT, bias=False)

            def forward(self, x):
                return self.b(self.a(x).tanh())
        model = Three()
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    return model


def make_optimizer(name: str, params, zero: bool = False, **extra):
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import SGD, Adam, AdamW
    cls, options = {"sgd": (SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
                    "adam": (Adam, dict(lr=0.01)),
                    "adamw": (AdamW, dict(lr=0.01, weight_decay=0.1))}[name]
    if zero:
        return ZeroRedundancyOptimizer(params, cls, **options, **extra)
    return cls(params, **options)


def global_batch(model_name: str, step: int):
    rng = np.random.default_rng(100 + step)
    if model_name == "gpt":
        tokens = rng.integers(0, VOCAB, size=(ROWS, BLOCK + 1))
        return tokens[:, :-1], tokens[:, 1:]
    return rng.standard_normal((ROWS, IN)), rng.integers(0, OUT, size=ROWS)


def loss_on(model, model_name: str, x, y):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    if model_name == "gpt":
        return model(Tensor(x), Tensor(y))[1]
    return F.cross_entropy(model(Tensor(x)), Tensor(y))


def train(model, opt, model_name: str, steps, rank: int = 0, world_size: int = 1,
          scheduler=None):
    """Steps ``steps`` of the global batch, this rank's contiguous share of each."""
    for step in steps:
        x, y = global_batch(model_name, step)
        rows = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
        opt.zero_grad()
        loss_on(model, model_name, x[rows], y[rows]).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def make_scheduler(opt, with_scheduler: bool):
    from neural_arch.optim import StepLR
    return StepLR(opt, step_size=2, gamma=0.5) if with_scheduler else None


def reference(model_name: str, optimizer_name: str, with_scheduler: bool,
              steps=range(STEPS)):
    """One process, the whole batch, a plain optimizer."""
    model = build_model(model_name)
    opt = make_optimizer(optimizer_name, model.parameters())
    train(model, opt, model_name, steps, scheduler=make_scheduler(opt, with_scheduler))
    return [p.data.copy() for p in model.parameters()]


def state_arrays(optimizer):
    """(number, bytes) of the arrays in an optimizer's per-parameter state."""
    arrays = [v for p in optimizer.state for v in optimizer.state[p].values()
              if isinstance(v, np.ndarray)]
    return len(arrays), sum(a.nbytes for a in arrays)


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
        params = [p.data.copy() for p in model.module.parameters()]
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
    return [p.data.copy() for p in model.parameters()], full


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
                    p.data[...] = np.full(p.data.shape, dist.get_rank() + group["offset"])

    params = [Parameter(cp.asarray(np.zeros(shape, dtype))) for shape, dtype in
              [((4, 3), np.float32), ((5,), np.float64), ((2, 2), np.float32), ((3,), np.float64),
               ((1,), np.float32)]]
    opt = ZeroRedundancyOptimizer(params, Stamp)
    opt.step()
    owner = {id(p): r for r in range(world_size) for p in opt.owned_parameters(r)}
    return [(type(p.data).__module__, cp.asnumpy(p.data), owner[id(p)]) for p in params]


def test_device_parameters_are_staged_through_the_host():
    results = run_ranks(device_worker, 3, "shm", timeout=60)
    for got in results:
        assert [(module, owner) for module, _, owner in got] == \
            [(module, owner) for module, _, owner in results[0]]
        for module, values, owner in got:
            assert module == "cupy"
            np.testing.assert_array_equal(values, np.full(values.shape, owner + 1.0))
    assert len({owner for _, _, owner in results[0]}) == 3


# ----- checkpoints --------------------------------------------------------------------------
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
    params = [p.data.copy() for p in model.module.parameters()]
    train(model, opt, "mlp", range(SPLIT, SPLIT + 1), rank, world_size, scheduler)
    errors.append(state_dict_error())  # stale after a step
    return full, scheduler.state_dict(), params, errors


def resume_worker(rank: int, world_size: int, full, scheduler_state, params):
    from neural_arch.distributed import DistributedDataParallel
    module = build_model("mlp")
    for p, value in zip(module.parameters(), params):
        p.data = value.copy()
    model = DistributedDataParallel(module)
    opt = make_optimizer("adam", model.parameters(), zero=True)
    scheduler = make_scheduler(opt, True)  # before loading: it resets the learning rates
    opt.load_state_dict(full)
    scheduler.load_state_dict(scheduler_state)
    counts = state_arrays(opt)[0], 2 * len(opt.owned_parameters())
    train(model, opt, "mlp", range(SPLIT, STEPS), rank, world_size, scheduler)
    return [p.data.copy() for p in module.parameters()], counts


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
        p.data = value.copy()
    opt = make_optimizer("adam", model.parameters())
    scheduler = StepLR(opt, step_size=2, gamma=0.5)
    opt.load_state_dict(full)
    scheduler.load_state_dict(scheduler_state)
    train(model, opt, "mlp", range(SPLIT, STEPS), scheduler=scheduler)
    for got, expected in zip(model.parameters(), want):
        np.testing.assert_allclose(got.data, expected, rtol=1e-9, atol=1e-12)

    # into ZeroRedundancyOptimizers at world size 3: each keeps its share's entries only
    resumed = run_ranks(resume_worker, 3, "tcp", args=(full, scheduler_state, params),
                        timeout=120)
    for got_params, (count, expected_count) in resumed:
        assert count == expected_count
        for got, expected in zip(got_params, want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def manager_worker(rank: int, world_size: int, directory: str, resume: bool):
    """Save with ``DistributedCheckpointManager`` after ``SPLIT`` steps (first without
    consolidating, which must fail), or resume from that checkpoint and finish training."""
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    model = DistributedDataParallel(build_model("mlp"))
    opt = make_optimizer("adam", model.parameters(), zero=True)
    scheduler = make_scheduler(opt, True)
    manager = DistributedCheckpointManager(directory)
    if resume:
        manager.load_checkpoint(model.module, opt, scheduler=scheduler)
        train(model, opt, "mlp", range(SPLIT, STEPS), rank, world_size, scheduler)
        return [p.data.copy() for p in model.module.parameters()]
    train(model, opt, "mlp", range(SPLIT), rank, world_size, scheduler)
    try:
        manager.save_checkpoint(model.module, opt, epoch=0, step=SPLIT, loss=None,
                                scheduler=scheduler)
        refused = None
    except Exception as exc:  # rank 0 fails; the others hear that it did
        refused = f"{type(exc).__name__}: {exc}"
    opt.consolidate_state_dict(to=0)  # the checkpoint's writer
    manager.save_checkpoint(model.module, opt, epoch=0, step=SPLIT, loss=None,
                            scheduler=scheduler)
    return refused


def test_checkpoint_manager_saves_after_consolidation_and_resumes_at_another_world_size(
        tmp_path):
    refused = run_ranks(manager_worker, 2, "shm", args=(str(tmp_path), False), timeout=120)
    assert "consolidate_state_dict" in refused[0]
    assert all(message is not None for message in refused)
    resumed = run_ranks(manager_worker, 3, "shm", args=(str(tmp_path), True), timeout=120)
    want = reference("mlp", "adam", True)
    for params in resumed:
        for got, expected in zip(params, want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


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
    views = all(p.data.base is not None for p in params)
    return [p.data.copy() for p in params], kept, views, opt.param_groups[1]["momentum"]


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
            np.testing.assert_allclose(a, b.data, rtol=1e-9, atol=1e-12)


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
    return [p.data.copy() for p in model.module.parameters()], refused, kinds


def test_advanced_ddp_zero_stage_1_wraps_the_optimizer():
    results = run_ranks(advanced_worker, 2, "shm", timeout=120)
    want = reference("mlp", "adam", False)
    for params, refused, kinds in results:
        assert "wrap_optimizer" in refused and kinds == (True, True)
        for got, expected in zip(params, want):
            np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-12)


def test_zero_stage_is_validated_and_stages_2_3_point_to_fsdp():
    from neural_arch.distributed.ddp import (AdvancedDistributedDataParallel,
                                             DistributedTrainingConfig)
    for bad in (5, -1, 1.0, True, "1"):
        with pytest.raises(ValueError, match=f"zero_stage must be one of.*got {bad!r}"):
            DistributedTrainingConfig(zero_stage=bad)
    for stage, strategy in ((2, "SHARD_GRAD_OP"), (3, "FULL_SHARD")):
        with pytest.raises(NotImplementedError, match=f"FullyShardedDataParallel.*{strategy}"):
            AdvancedDistributedDataParallel(build_model("mlp"),
                                            DistributedTrainingConfig(zero_stage=stage))


# ----- bad input ------------------------------------------------------------------------------
def test_optimizer_class_must_be_an_optimizer_subclass():
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import SGD
    params = list(build_model("mlp").parameters())
    for bad in (object, SGD(params, lr=0.1), "SGD"):
        with pytest.raises(TypeError, match="optimizer_class to be an Optimizer subclass"):
            ZeroRedundancyOptimizer(params, bad, lr=0.1)
    with pytest.raises(NotImplementedError, match="overlap_with_ddp=True"):
        ZeroRedundancyOptimizer(params, SGD, overlap_with_ddp=True, lr=0.1)


def mismatch_worker(rank: int, world_size: int):
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import SGD
    model = make_model(seed=1, sizes=(IN, 5 + (rank == 2), OUT))
    ZeroRedundancyOptimizer(model.parameters(), SGD, lr=0.1)


def test_parameters_differing_across_ranks_are_rejected_naming_the_ranks():
    with pytest.raises(RankFailed, match=r"differ across ranks: ranks \[2\].*parameter #0 of "
                                         r"group 0 has shape \(5, 7\).*\(6, 7\) and dtype float64 on rank 2"):
        run_ranks(mismatch_worker, 3, "shm", timeout=60)


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
