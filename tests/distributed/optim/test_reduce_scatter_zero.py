"""ReduceScatterZeroOptimizer (ZeRO-1 by reduce-scatter, the "zero1" strategy's) on real
processes: the weights of one process with a plain optimizer on the whole batch, for parameter
counts that no world size divides; the bytes a step sends on tcp against 2(N-1)/N of the model
(and DDP + ZeroRedundancyOptimizer's 3(N-1)/N); its state in the standard format."""
from __future__ import annotations

import numpy as np
import pytest

from ddp_cases import make_model
from dist_harness import run_ranks
from zero_cases import STEPS, make_optimizer, train

pytestmark = pytest.mark.timeout(120)

SIZES = (7, 96, 95, 4)  # 10367 parameters: odd, and not a multiple of 3 or 4
PSI = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:]))
ITEMSIZE = 8  # float64


def zero_options(name):
    from neural_arch.optim import SGD, Adam
    return {"sgd": (SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
            "adam": (Adam, dict(lr=0.01))}[name]


def reference(optimizer_name):
    model = make_model(seed=10, sizes=SIZES)
    opt = make_optimizer(optimizer_name, model.parameters())
    train(model, opt, "mlp", range(STEPS))
    return [p.array.copy() for p in model.parameters()], opt.state_dict()


def rs_worker(rank, world_size, optimizer_name):
    """STEPS of the fixed global batch, this rank's rows; the weights, the bytes each step
    sent, the optimizer state's elements on this rank."""
    from neural_arch.distributed.optim import ReduceScatterZeroOptimizer
    from neural_arch.distributed.transports.sent_bytes import counting_sent_bytes
    model = make_model(seed=10, sizes=SIZES)
    cls, options = zero_options(optimizer_name)
    opt = ReduceScatterZeroOptimizer(model.parameters(), cls, **options)
    sent = []
    for step in range(STEPS):
        with counting_sent_bytes() as tally:
            train(model, opt, "mlp", [step], rank, world_size)
        sent.append(tally.counted)
    state = sum(v.size for p in opt.state for v in opt.state[p].values()
                if isinstance(v, np.ndarray))
    return [p.array.copy() for p in model.parameters()], sent, state


def ddp_zero_worker(rank, world_size):
    """One step of DDP + ZeroRedundancyOptimizer: the bytes it sent."""
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.transports.sent_bytes import counting_sent_bytes
    model = DistributedDataParallel(make_model(seed=10, sizes=SIZES))
    opt = make_optimizer("sgd", model.parameters(), zero=True)
    with counting_sent_bytes() as tally:
        train(model, opt, "mlp", [0], rank, world_size)
    return tally.counted


@pytest.mark.parametrize("backend,world_size,optimizer_name", [
    ("shm", 2, "adam"), ("shm", 3, "sgd"), ("shm", 4, "adam"),
    ("tcp", 2, "sgd"), ("tcp", 3, "adam"), ("tcp", 4, "sgd"),
])
def test_reduce_scatter_zero_trains_the_one_process_model(backend, world_size, optimizer_name):
    want, _ = reference(optimizer_name)
    results = run_ranks(rs_worker, world_size, backend, args=(optimizer_name,))
    shard = -(-PSI // world_size)
    per_element = 2 if optimizer_name == "adam" else 1
    for rank, (weights, sent, state) in enumerate(results):
        for got, ref in zip(weights, want):
            np.testing.assert_allclose(got, ref, rtol=1e-9, atol=1e-12,
                                       err_msg=f"rank {rank} of {world_size} ({backend})")
        assert state == per_element * shard  # 1/N of the elements, whatever the shapes
        if backend == "tcp":
            # a ring reduce-scatter and a ring all-gather: (N - 1) shards each
            assert sent == [2 * (world_size - 1) * shard * ITEMSIZE] * STEPS, sent


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_step_sends_less_than_ddp_plus_zero_redundancy(world_size):
    rs = run_ranks(rs_worker, world_size, "tcp", args=("sgd",))
    ddp = run_ranks(ddp_zero_worker, world_size, "tcp")
    fraction = (world_size - 1) / world_size
    for (_, sent, _), ddp_sent in zip(rs, ddp):
        assert sent[0] == pytest.approx(2 * fraction * PSI * ITEMSIZE, rel=0.01)
        # the all-reduce's 2(N-1)/N, then an all-gather of whole parameters: pieces padded to
        # the most loaded rank's (here one 96 x 95 weight), so more than (N-1)/N
        assert ddp_sent >= 3 * fraction * PSI * ITEMSIZE
        assert sent[0] < 0.8 * ddp_sent


def checkpoint_worker(rank, world_size):
    """Three Adam steps, then the consolidated state on rank 0, loaded back on every rank
    into a new optimizer and consolidated again."""
    from neural_arch.distributed import broadcast_object_list
    from neural_arch.distributed.optim import ReduceScatterZeroOptimizer
    from neural_arch.optim import Adam
    model = make_model(seed=10, sizes=SIZES)
    opt = ReduceScatterZeroOptimizer(model.parameters(), Adam, lr=0.01)
    train(model, opt, "mlp", range(3), rank, world_size)
    opt.consolidate_state_dict(to=0)
    full = [opt.state_dict() if rank == 0 else None]
    if rank != 0:  # the full state is on rank 0 only
        with pytest.raises(RuntimeError, match=rf"ReduceScatterZeroOptimizer.state_dict\(\) on "
                           rf"rank {rank}: the optimizer state is sharded over 3 ranks .* "
                           rf"call consolidate_state_dict\(to=rank\) on every rank first"):
            opt.state_dict()
    broadcast_object_list(full, src=0)
    again = ReduceScatterZeroOptimizer(model.parameters(), Adam, lr=0.5)
    again.load_state_dict(full[0])
    again.consolidate_state_dict(to=0)
    return full[0], again.state_dict() if rank == 0 else None


def test_state_is_the_plain_optimizers_per_parameter_state():
    model = make_model(seed=10, sizes=SIZES)
    plain = make_optimizer("adam", model.parameters())
    train(model, plain, "mlp", range(3))
    want = plain.state_dict()
    full, reloaded = run_ranks(checkpoint_worker, 3, "shm")[0]
    for saved in (full, reloaded):
        assert sorted(saved["state"]) == sorted(want["state"])
        assert saved["param_groups"][0]["lr"] == 0.01
        for index, entry in want["state"].items():
            for key, value in entry.items():
                np.testing.assert_allclose(saved["state"][index][key], value, rtol=1e-9,
                                           atol=1e-15, err_msg=f"param {index} {key}")


def resume_worker(rank, world_size, directory):
    """Two steps, a checkpoint, two more; then a new model and optimizer restored from the
    checkpoint, the same two more steps: both sets of weights."""
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    from neural_arch.distributed.optim import ReduceScatterZeroOptimizer
    from neural_arch.optim import Adam

    def fresh():
        model = make_model(seed=10, sizes=SIZES)
        return model, ReduceScatterZeroOptimizer(model.parameters(), Adam, lr=0.01)
    model, opt = fresh()
    train(model, opt, "mlp", range(2), rank, world_size)
    DistributedCheckpointManager(directory, 2).save_checkpoint(model, opt, 0, 2, None)
    train(model, opt, "mlp", range(2, 4), rank, world_size)
    model2, opt2 = fresh()
    DistributedCheckpointManager(directory, 2).load_checkpoint(model2, opt2)
    train(model2, opt2, "mlp", range(2, 4), rank, world_size)
    return [p.array.copy() for p in model.parameters()], [p.array.copy()
                                                          for p in model2.parameters()]


def test_a_checkpoint_resumes_the_same_training(tmp_path):
    for straight, resumed in run_ranks(resume_worker, 3, "shm", args=(str(tmp_path),)):
        for a, b in zip(straight, resumed):
            assert a.tobytes() == b.tobytes()


def mismatch_worker(rank: int, world_size: int):
    from neural_arch.distributed.optim import ReduceScatterZeroOptimizer
    from neural_arch.optim import SGD
    model = make_model(seed=1, sizes=(SIZES[0], 5 + (rank == 1), SIZES[-1]))
    ReduceScatterZeroOptimizer(model.parameters(), SGD, lr=0.1)


def test_parameters_differing_across_ranks_are_rejected_naming_the_first_difference():
    from dist_harness import RankFailed
    with pytest.raises(RankFailed, match=r"ReduceScatterZeroOptimizer: the parameters differ "
                                         r"across ranks: ranks \[1\].*parameter #0 of group 0 "
                                         r"has shape \(5, 7\).*\(6, 7\) and dtype float64 on "
                                         r"rank 1"):
        run_ranks(mismatch_worker, 2, "shm", timeout=60)
