"""Communication hooks inside training: automatic and explicit sync, no_sync() accumulation,
unused parameters, shared buckets kept for the plain average and given up for a hook of the
user's own, and digits trained to the accuracy of exact averaging."""
from __future__ import annotations

import numpy as np
import pytest

from ddp_cases import check_against_reference, train_ddp, train_reference, two_heads
from dist_harness import RankFailed, each_case, job_once, run_ranks

pytestmark = pytest.mark.timeout(240)


def _hook(kind: str):
    from neural_arch.distributed import comm_hooks as ch
    if kind == "powersgd":
        return ch.PowerSGDState(None, matrix_approximation_rank=2, start_powerSGD_iter=1), \
            ch.powerSGD_hook
    if kind == "topk":
        return ch.TopKState(0.3), ch.topk_hook
    return None, ch.allreduce_hook


def hooked_worker(rank: int, world_size: int, kind: str, auto_sync: bool, micro: int):
    from ddp_cases import make_model, make_optimizer
    from neural_arch.distributed import DistributedDataParallel, get_backend
    model = DistributedDataParallel(make_model(seed=rank + 10), auto_sync=auto_sync,
                                    bucket_size_mb=0.0005)
    model.register_comm_hook(*_hook(kind))
    # the plain average is what shared buckets compute: they stay; other hooks need private ones
    assert model.shared_buckets == (kind == "allreduce" and get_backend() == "shm")
    opt = make_optimizer("sgd", model.parameters())
    return train_ddp(model, opt, rank, world_size, micro, sync=not auto_sync)


def hooked_cases(rank: int, world_size: int, cases):
    """``hooked_worker`` for each (kind, auto_sync, micro) of ``cases`` in turn, each with a
    DDP model and optimizer of its own, in one job: {case: its result}."""
    return each_case(lambda case: hooked_worker(rank, world_size, *case), cases,
                     "the case (kind, auto_sync, micro)")


# Every case of a test below on one backend runs in one job (the first test of that backend
# starts it, the others read its result): the same trainings, without a process start-up
# (seconds under mpiexec) per case. Each test still checks its own case alone.
ALLREDUCE_CASES = [("allreduce", auto_sync, micro) for auto_sync in (True, False)
                   for micro in (1, 3)]
COMPRESSING_CASES = [(kind, auto_sync, micro) for kind in ("powersgd", "topk")
                     for micro in (1, 3) for auto_sync in (True, False)]
_JOBS: dict = {}


def hooked_results(backend: str, world_size: int, cases: list, case: tuple) -> list:
    """Every rank's result of ``case``, from the one job that ran ``cases`` on ``backend``."""
    job = job_once(_JOBS, (backend, world_size, tuple(cases)), lambda: run_ranks(
        hooked_cases, world_size, backend, args=(cases,), timeout=200))
    return [by_case[case] for by_case in job]


@pytest.mark.parametrize("auto_sync", [True, False])
@pytest.mark.parametrize("micro", [1, 3])
def test_allreduce_hook_trains_like_one_process(backend, auto_sync, micro):
    results = hooked_results(backend, 2, ALLREDUCE_CASES, ("allreduce", auto_sync, micro))
    check_against_reference(results, train_reference(2, "sgd", micro=micro))


@pytest.mark.parametrize("kind", ["powersgd", "topk"])
@pytest.mark.parametrize("micro", [1, 3])
def test_compressing_hooks_agree_in_automatic_and_explicit_mode(backend, kind, micro):
    auto = hooked_results(backend, 3, COMPRESSING_CASES, (kind, True, micro))
    explicit = hooked_results(backend, 3, COMPRESSING_CASES, (kind, False, micro))
    exact = train_reference(3, "sgd", micro=micro)
    for (a, buckets), (e, _) in zip(auto, explicit):
        assert buckets > 1
        for got, want in zip(a, auto[0][0]):
            assert got.tobytes() == want.tobytes(), "ranks must hold identical parameters"
        for got, want in zip(a, e):
            assert got.tobytes() == want.tobytes()
    # compression changed the training (else the hook did not run), but not by much
    differences = [np.abs(got - want).max() for got, want in zip(auto[0][0], exact)]
    assert 0 < max(differences) < 0.5


def unused_worker(rank: int, world_size: int, kind: str):
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(two_heads(), find_unused_parameters=True, auto_sync=False)
    state, hook = _hook(kind)
    model.register_comm_hook(state, hook)
    x = Tensor(np.ones((2, 3), dtype=np.float32) * (rank + 1))
    model(x, use_b=(rank == 0)).sum().backward()
    model.sync_gradients()
    m = model.module
    return m.b.weight.grad.array.copy(), m.never.weight.grad, m.a.weight.grad.array.copy()


@pytest.mark.parametrize("kind", ["allreduce", "topk"])
def test_hooks_with_unused_parameters_follow_pytorch(kind):
    for b, never, a in run_ranks(unused_worker, 2, "shm", args=(kind,)):
        assert never is None, "unused on every rank: gradient stays None"
        # top-k at 30% of a bucket: only the largest entries arrive in the first step
        if kind == "allreduce":
            np.testing.assert_allclose(b, np.full((2, 3), 1.0))
            np.testing.assert_allclose(a, np.full((2, 3), 3.0))


def shared_worker(rank: int, world_size: int, insist, own_hook: bool):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.comm_hooks import allreduce_hook
    from neural_arch.nn import Linear

    def users_hook(state, bucket):  # runs a collective of its own: private buckets
        return allreduce_hook(state, bucket)
    model = DistributedDataParallel(Linear(4, 3), shared_buckets=insist)
    before = model.shared_buckets
    model.register_comm_hook(None, users_hook if own_hook else allreduce_hook)
    for p in model.module.parameters():
        p.grad = np.full(p.array.shape, float(rank), dtype=np.float32)
    model.sync_gradients()
    return before, model.shared_buckets, model.module.weight.grad.array.copy()


@pytest.mark.parametrize("insist", [None, True])
def test_allreduce_hook_keeps_shared_buckets(insist):
    for before, after, grad in run_ranks(shared_worker, 2, "shm", args=(insist, False)):
        assert before and after, "allreduce_hook averages as shared buckets do: they stay"
        np.testing.assert_array_equal(grad, np.full((3, 4), 0.5, dtype=np.float32))


def test_a_users_hook_moves_shared_buckets_to_private_ones():
    for before, after, grad in run_ranks(shared_worker, 2, "shm", args=(None, True)):
        assert before and not after
        np.testing.assert_array_equal(grad, np.full((3, 4), 0.5, dtype=np.float32))
    with pytest.raises(RankFailed, match=r"register_comm_hook\(.*users_hook\): "
                                         r"shared_buckets=True was asked for"):
        run_ranks(shared_worker, 2, "shm", args=(True, True), timeout=60)


# ----- digits ---------------------------------------------------------------------------------
EPOCHS, BATCH, HIDDEN = 20, 32, 64
HOOKS = ("none", "fp16", "powersgd-1", "powersgd-4", "topk-1%")


def digits_arrays():
    """``load_digits(seed=0)``'s (train, test) arrays, loaded here and passed to the ranks:
    importing scikit-learn takes about 2 s a process."""
    from neural_arch.data import load_digits
    train, test = load_digits(seed=0)
    return train.arrays, test.arrays


def digits_worker(rank: int, world_size: int, kinds, digits):
    """Train the same MLP on this rank's half of digits once per hook; test accuracy each."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed, no_grad
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed import comm_hooks as ch
    from neural_arch.models import MLP
    from neural_arch.optim import SGD, CosineAnnealingLR
    (x, y), (tx, ty) = digits
    out = {}
    for kind in kinds:
        manual_seed(0)
        model = DistributedDataParallel(MLP([64, HIDDEN, HIDDEN, 10]))
        if kind == "fp16":
            model.register_comm_hook(None, ch.fp16_compress_hook)
        elif kind.startswith("powersgd-"):
            model.register_comm_hook(ch.PowerSGDState(
                None, matrix_approximation_rank=int(kind[9:]), start_powerSGD_iter=10),
                ch.powerSGD_hook)
        elif kind.startswith("topk-"):
            model.register_comm_hook(ch.TopKState(float(kind[5:-1]) / 100), ch.topk_hook)
        opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
        # annealed to zero, so the final weights do not hop between nearby minima
        schedule = CosineAnnealingLR(opt, T_max=EPOCHS)
        order = np.random.default_rng(1)
        for _ in range(EPOCHS):
            mine = order.permutation(len(y))[rank::world_size]
            for start in range(0, len(mine) - BATCH + 1, BATCH):
                rows = mine[start:start + BATCH]
                opt.zero_grad()
                F.cross_entropy(model(Tensor(x[rows])), Tensor(y[rows])).backward()
                opt.step()
            schedule.step()
        with no_grad():
            predicted = model(Tensor(tx)).array.argmax(axis=1)
        out[kind] = (float((predicted == ty).mean()),
                     b"".join(p.array.tobytes() for p in model.module.parameters()))
    return out


def test_digits_with_each_hook_within_one_percent_of_exact_averaging():
    results = run_ranks(digits_worker, 2, "shm", args=(HOOKS, digits_arrays()), timeout=220)
    exact = results[0]["none"][0]
    assert exact > 0.9
    for kind in HOOKS:
        accuracy, params = results[0][kind]
        assert results[1][kind][1] == params, f"{kind}: ranks ended with different parameters"
        assert accuracy >= exact - 0.01, f"{kind}: {accuracy:.4f} against {exact:.4f}"
