"""ZeroRedundancyOptimizer(overlap_with_ddp=True) under DDP's communication hook
(``hook_with_zero_step``, ``hook_with_zero_step_interleaved``), on real processes: after every
step the parameters are those of DDP with the plain optimizer (and the same averaging hook:
exact, float16, PowerSGD), bit for bit, on every rank, from the first step (our DDP fixes its
buckets at construction); the consolidated state is the
plain optimizer's; buckets dealt to ranks (one rank owning none) or split over ranks
(``shard_buckets=True``); torch's module path; and misuse, raising with the values."""
from __future__ import annotations

import importlib

import numpy as np
import pytest

from ddp_cases import make_model, rank_share
from dist_harness import run_ranks
from leftovers_fixture import leftovers  # noqa: F401
from zero_cases import make_optimizer

pytestmark = pytest.mark.timeout(60)

STEPS = 3
TORCH_PATH = "neural_arch.distributed.algorithms.ddp_comm_hooks"


def _train(ddp, opt, rank: int, world_size: int):
    """Parameters after each step of this rank's share of the DDP tests' batches. After the
    first step every parameter's ``.array`` is rebound to new values, as a model's
    ``load_state_dict`` may do: the updates must start from them."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    history = []
    for step in range(STEPS):
        if step == 1:
            for p in ddp.module.parameters():
                p.array = p.array * 0.5
        x, y = rank_share(step, rank, world_size)
        opt.zero_grad()
        F.cross_entropy(ddp(Tensor(x)), Tensor(y)).backward()
        opt.step()
        history.append([p.array.copy() for p in ddp.module.parameters()])
    return history


def _hook(name: str):
    """(state, hook) averaging the buckets: exact, in float16, or PowerSGD from the second
    step on (its future runs a second all-reduce when waited for)."""
    from neural_arch.distributed.comm_hooks import PowerSGDState, powerSGD_hook
    default_hooks = importlib.import_module(f"{TORCH_PATH}.default_hooks")
    if name == "powerSGD":
        return PowerSGDState(None, matrix_approximation_rank=1, start_powerSGD_iter=1), \
            powerSGD_hook
    return None, getattr(default_hooks, name)


def overlap_worker(rank: int, world_size: int, optimizer_name: str, bucket_bytes: int,
                   shard_buckets: bool, hook_name: str, without_update_segment: bool = False):
    """DDP + the plain optimizer, then DDP + ZeRO under each of the two hooks (imported by
    torch's module path) wrapping the same averaging hook, from the same weights on the same
    batches. ``without_update_segment``: shared memory refuses the segment of the owners'
    updates (they then pass through DDP's shared buckets)."""
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.optim.shared_updates import SharedUpdates
    if without_update_segment:
        SharedUpdates.open = classmethod(lambda cls, *args: None)
    hooks = importlib.import_module(f"{TORCH_PATH}.ddp_zero_hook")
    runs = {}
    for variant in ("ddp", "hook_with_zero_step", "hook_with_zero_step_interleaved"):
        ddp = DistributedDataParallel(make_model(seed=10), bucket_size_mb=bucket_bytes / 2 ** 20)
        zero = variant != "ddp"
        opt = make_optimizer(optimizer_name, ddp.parameters(), zero=zero,
                             **({"overlap_with_ddp": True} if zero else {}))
        state, hook = _hook(hook_name)
        if zero:
            wrap = getattr(hooks, variant)
            hook = wrap(hook, ddp, opt, shard_buckets=shard_buckets)
        if zero or hook_name != "allreduce_hook":
            ddp.register_comm_hook(state, hook)
        history = _train(ddp, opt, rank, world_size)
        opt.consolidate_state_dict(to=0) if zero else None
        state = opt.state_dict() if rank == 0 or not zero else None
        index = {id(p): i for i, p in enumerate(ddp.module.parameters())}
        owned = sorted(index[id(p)] for p in opt.owned_parameters()) if zero else None
        runs[variant] = (history, state, owned, len(ddp.bucket_parameters()),
                         ddp.shared_buckets)
    return runs


CASES = [  # (world size, backend, optimizer, DDP bucket cap in bytes, shard_buckets, hook)
    (2, "shm", "sgd", 60, False, "fp16_compress_hook"),  # 5 buckets, dealt 3 + 2
    (2, "tcp", "adam", 700, True, "allreduce_hook"),  # 2 buckets, the larger split over both
    (3, "shm", "sgd", 300, False, "powerSGD"),        # 3 buckets, one each
    # the plain average on shm: shared buckets, the owners' updates passed through them
    (2, "shm", "adam", 700, True, "allreduce_hook"),
    (3, "shm", "adam", 60, False, "allreduce_hook"),  # 5 buckets, dealt 2 + 2 + 1
    (3, "tcp", "sgd", 700, False, "allreduce_hook"),  # 2 buckets: rank 2 owns none
    (1, "shm", "sgd", 300, False, "allreduce_hook"),  # one rank: the hook runs there too
]


@pytest.mark.parametrize("world_size,backend,optimizer_name,bucket_bytes,shard_buckets,hook_name",
                         CASES)
def test_overlap_equals_ddp_with_the_plain_optimizer(world_size, backend, optimizer_name,
                                                     bucket_bytes, shard_buckets, hook_name):
    _check_overlap(world_size, backend, optimizer_name, bucket_bytes, shard_buckets, hook_name)


def test_updates_through_the_shared_buckets_without_their_own_segment():
    _check_overlap(3, "shm", "adam", 60, False, "allreduce_hook", without_update_segment=True)


def _check_overlap(world_size, backend, optimizer_name, bucket_bytes, shard_buckets, hook_name,
                   without_update_segment=False):
    results = run_ranks(overlap_worker, world_size, backend,
                        args=(optimizer_name, bucket_bytes, shard_buckets, hook_name,
                              without_update_segment), timeout=50)
    want_history, want_state, _, buckets, _ = results[0]["ddp"]
    for variant in ("hook_with_zero_step", "hook_with_zero_step_interleaved"):
        for rank, runs in enumerate(results):
            for step, (got, want) in enumerate(zip(runs[variant][0], want_history)):
                for i, (a, b) in enumerate(zip(got, want)):
                    # the owner runs the plain optimizer's arithmetic on the same averaged
                    # gradient; the others receive its bits
                    assert a.tobytes() == b.tobytes(), (
                        f"{variant}: rank {rank}, step {step}, parameter {i} differs from DDP "
                        f"with the plain optimizer by {np.max(np.abs(a - b))}")
        state = results[0][variant][1]
        assert state["param_groups"] == want_state["param_groups"]
        assert sorted(state["state"]) == sorted(want_state["state"])
        for index, entry in want_state["state"].items():
            for key, value in entry.items():
                np.testing.assert_array_equal(state["state"][index][key], value,
                                              err_msg=f"{variant}: state {key} of {index}")
        owned = [runs[variant][2] for runs in results]
        assert sorted(i for share in owned for i in share) == list(range(len(want_history[0])))
        if world_size == 3 and buckets == 2 and not shard_buckets:
            assert owned[2] == [], owned  # torch's rule: bucket i goes to rank i % world size
        if shard_buckets:  # the larger bucket (both layers' last parameters) is split
            assert all(owned), owned
        # shared buckets serve the plain average (and the exchange of updates) on shm
        want_shared = backend == "shm" and hook_name == "allreduce_hook" and world_size > 1
        assert [runs[variant][4] for runs in results] == [want_shared] * world_size
    assert buckets == {60: 5, 300: 3, 700: 2}[bucket_bytes]


def test_torch_module_path_is_ours():
    from neural_arch.distributed import comm_hooks
    from neural_arch.distributed.comm_hooks import ddp_zero_hook, default_hooks
    ported = importlib.import_module(f"{TORCH_PATH}.ddp_zero_hook")
    assert ported is ddp_zero_hook
    assert ported.hook_with_zero_step is comm_hooks.hook_with_zero_step
    assert importlib.import_module(TORCH_PATH) is comm_hooks
    assert importlib.import_module(f"{TORCH_PATH}.default_hooks") is default_hooks
    # importing by torch's path leaves the package's names as they were
    assert callable(comm_hooks.hook_with_zero_step) and callable(comm_hooks.allreduce_hook)


# ----- misuse -----------------------------------------------------------------------------------
def _error(fn):
    try:
        fn()
    except Exception as exc:  # the type and message go back to the test
        return type(exc).__name__, str(exc)
    return None


def misuse_worker(rank: int, world_size: int):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.comm_hooks import (allreduce_hook, hook_with_zero_step,
                                                    hook_with_zero_step_interleaved)
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import SGD

    def backward(ddp):
        x, y = rank_share(0, rank, world_size)
        F.cross_entropy(ddp(Tensor(x)), Tensor(y)).backward()

    errors = {}
    ddp = DistributedDataParallel(make_model(seed=10), bucket_size_mb=300 / 2 ** 20)
    zero = ZeroRedundancyOptimizer(ddp.parameters(), SGD, overlap_with_ddp=True, lr=0.1)
    errors["consolidate_unattached"] = _error(lambda: zero.consolidate_state_dict(0))
    backward(ddp)  # no hook: the gradients are averaged, nothing is updated
    errors["step_without_hook"] = _error(zero.step)
    errors["plain_optimizer"] = _error(
        lambda: hook_with_zero_step(allreduce_hook, ddp, SGD(ddp.parameters(), lr=0.1)))
    not_overlapping = ZeroRedundancyOptimizer(ddp.parameters(), SGD, lr=0.1)
    errors["not_overlapping"] = _error(
        lambda: hook_with_zero_step_interleaved(allreduce_hook, ddp, not_overlapping))
    errors["not_a_ddp"] = _error(lambda: hook_with_zero_step(allreduce_hook, ddp.module, zero))
    partial = ZeroRedundancyOptimizer(list(ddp.parameters())[:2], SGD, overlap_with_ddp=True,
                                      lr=0.1)
    errors["other_parameters"] = _error(lambda: hook_with_zero_step(allreduce_hook, ddp,
                                                                    partial))
    errors["add_group"] = _error(lambda: zero.add_param_group(
        {"params": [next(iter(make_model(seed=1).parameters()))]}))
    # a hook built but registered on no DDP: the backward updates nothing, step() says so
    unused = DistributedDataParallel(make_model(seed=10), bucket_size_mb=300 / 2 ** 20)
    unregistered = ZeroRedundancyOptimizer(unused.parameters(), SGD, overlap_with_ddp=True,
                                           lr=0.1)
    hook_with_zero_step(allreduce_hook, unused, unregistered)
    backward(unused)
    errors["hook_not_registered"] = _error(unregistered.step)
    # registered: the step ran in backward; step() once is fine, a second one is refused
    used = DistributedDataParallel(make_model(seed=10), bucket_size_mb=300 / 2 ** 20)
    registered = ZeroRedundancyOptimizer(used.parameters(), SGD, overlap_with_ddp=True, lr=0.1)
    used.register_comm_hook(None, hook_with_zero_step(allreduce_hook, used, registered))
    backward(used)
    errors["first_step"] = _error(registered.step)
    errors["second_step"] = _error(registered.step)
    # built for one DDP, registered on another (shared buckets on shm): the backward refuses
    built_for = DistributedDataParallel(make_model(seed=10), bucket_size_mb=300 / 2 ** 20)
    other = DistributedDataParallel(make_model(seed=10), bucket_size_mb=300 / 2 ** 20)
    stray = ZeroRedundancyOptimizer(built_for.parameters(), SGD, overlap_with_ddp=True, lr=0.1)
    other.register_comm_hook(None, hook_with_zero_step(allreduce_hook, built_for, stray))
    errors["other_ddp"] = _error(lambda: backward(other))
    return errors


def test_misuse_raises_with_the_values():
    errors = run_ranks(misuse_worker, 2, "shm", timeout=50)[0]
    kind, message = errors["consolidate_unattached"]
    assert kind == "RuntimeError" and "hook_with_zero_step" in message, errors
    kind, message = errors["step_without_hook"]
    assert kind == "RuntimeError" and "overlap_with_ddp=True" in message \
        and "register_comm_hook" in message, errors
    kind, message = errors["plain_optimizer"]
    assert kind == "TypeError" and "ZeroRedundancyOptimizer" in message and "SGD" in message
    kind, message = errors["not_overlapping"]
    assert kind == "ValueError" and "overlap_with_ddp=True" in message
    kind, message = errors["not_a_ddp"]
    assert kind == "TypeError" and "DistributedDataParallel" in message and "MLP" in message
    kind, message = errors["other_parameters"]
    assert kind == "ValueError" and "2 parameters" in message and "6" in message, message
    kind, message = errors["add_group"]
    assert kind == "RuntimeError" and "add_param_group" in message
    kind, message = errors["hook_not_registered"]
    assert kind == "RuntimeError" and "register_comm_hook" in message
    assert errors["first_step"] is None
    kind, message = errors["second_step"]
    assert kind == "RuntimeError" and "since the last step()" in message
    kind, message = errors["other_ddp"]
    assert kind == "RuntimeError" and "register the hook on that one" in message, message


def unused_parameter_worker(rank: int, world_size: int):
    """ZeRO stepping inside DDP's hook with ``find_unused_parameters``: head ``b`` is used on
    rank 0 only, ``never`` on no rank. The parameters after two SGD steps (weight decay moves a parameter stepped with a zero gradient)."""
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    from ddp_cases import two_heads
    hooks = importlib.import_module(f"{TORCH_PATH}.ddp_zero_hook")
    default_hooks = importlib.import_module(f"{TORCH_PATH}.default_hooks")
    ddp = DistributedDataParallel(two_heads(), find_unused_parameters=True)
    opt = make_optimizer("sgd", ddp.parameters(), zero=True, overlap_with_ddp=True)
    ddp.register_comm_hook(None, hooks.hook_with_zero_step(default_hooks.allreduce_hook, ddp,
                                                           opt))
    for step in range(2):
        x = Tensor(np.full((2, 3), rank + step + 1.0, np.float32))
        opt.zero_grad()
        ddp(x, use_b=rank == 0).sum().backward()
        opt.step()
    return [p.array.copy() for p in ddp.module.parameters()], ddp.shared_buckets


def test_a_parameter_no_rank_used_is_stepped_alike_on_every_transport():
    """On shm's shared buckets as under the hook elsewhere (torch's: the bucket's zeros are
    stepped), so a script gives the same parameters on every transport."""
    shm = run_ranks(unused_parameter_worker, 2, "shm")
    tcp = run_ranks(unused_parameter_worker, 2, "tcp")
    assert [shared for _, shared in shm] == [True, True]
    for (ours, _), (theirs, _) in zip(shm + tcp, tcp + shm):
        assert all(a.tobytes() == b.tobytes() for a, b in zip(ours, theirs))
