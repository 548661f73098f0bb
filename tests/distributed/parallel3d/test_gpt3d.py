"""GPT3D on real processes: a dp x tp x pp mesh trains like one dense process, and its
checkpoints load back on the mesh (resuming exactly) and into a dense GPT.

Every run is compared with the dense GPT trained in the test process on the same global batch
(float64, AdamW): the loss of each step and, through ``load_dense_checkpoint``, every parameter
at the end, and the loaded dense model's logits.
"""
from __future__ import annotations

import contextlib
import io

import numpy as np
import pytest

from dist_harness import run_ranks
from gpt3d_cases import SEED, SIZES, dense_gpt, tokens

STEPS, BATCH, LR = 3, 8, 3e-2


def _batch(step):
    return tokens(100 + step, BATCH)


def _dense_run():
    from neural_arch.optim import AdamW
    model, params = dense_gpt()
    opt = AdamW(params, lr=LR)
    losses = []
    for s in range(STEPS):
        x, y = _batch(s)
        opt.zero_grad()
        _, loss = model(x, y)
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
    return model, losses


def _train(rank, world_size, shape, schedule, data_parallel, micro, parent):
    from neural_arch.core.random import manual_seed
    from neural_arch.distributed import init_device_mesh
    from neural_arch.distributed.parallel3d import GPT3D
    from neural_arch.models.gpt import GPTConfig
    mesh = init_device_mesh(shape, mesh_dim_names=("dp", "tp", "pp"))

    def build(seed):
        manual_seed(seed)
        return GPT3D(GPTConfig(**SIZES), mesh, micro, schedule=schedule,
                     data_parallel=data_parallel, dtype=np.float64, lr=LR)
    model = build(SEED)
    losses, printed = [], io.StringIO()
    launches = _count_async_all_reduces()
    for s in range(STEPS):
        if s == STEPS - 1:
            resume_from = model.save(parent, "before-last")
        losses.append(model.train_step(*_batch(s)))
        with contextlib.redirect_stdout(printed):  # what this rank prints, to check which do
            model.log(f"step {s} loss {losses[-1]:.6f}")
    per_step = len(launches) / STEPS
    final = model.save(parent, "final")
    # a model built from another seed, loaded from the checkpoint, takes the same last step
    other = build(99)
    other.load(resume_from)
    resumed = other.train_step(*_batch(STEPS - 1))
    return dict(losses=losses, resumed=resumed, final=final, logs=model.logs,
                overlapped=model.overlapped, launches=per_step,
                steps=other.steps, printed=printed.getvalue(),
                coordinate=dict(zip(("dp", "tp", "pp"), mesh.get_coordinate())))


def _count_async_all_reduces():
    """A list that gets an entry per asynchronous all-reduce from now on (DDP's bucket
    launches; GPT3D's own collectives are synchronous)."""
    from neural_arch.distributed import collectives
    launches, original = [], collectives.all_reduce

    def counting(*args, **kwargs):
        if kwargs.get("async_op"):
            launches.append(1)
        return original(*args, **kwargs)
    collectives.all_reduce = counting  # this rank's process only
    return launches


def _check(results, dense, dense_losses):
    from neural_arch.distributed.parallel3d import load_dense_checkpoint
    from neural_arch.models.gpt import GPT, GPTConfig
    for r in results:
        np.testing.assert_allclose(r["losses"], dense_losses, rtol=0, atol=1e-10)
        assert r["resumed"] == pytest.approx(r["losses"][-1], abs=1e-12)
        assert r["steps"] == STEPS
    fields, state = load_dense_checkpoint(results[0]["final"])
    reference = dense.state_dict()
    assert list(state) == list(reference)  # the dense model's keys, in its order
    for key, value in reference.items():
        np.testing.assert_allclose(state[key], value, rtol=0, atol=1e-10, err_msg=key)
    loaded = GPT(GPTConfig(**fields))
    for p in loaded.parameters():  # the run was float64; a new GPT is float32
        p.array = p.array.astype(np.float64)
    loaded.load_state_dict(state)
    x, _ = _batch(0)
    np.testing.assert_allclose(loaded(x)[0].array, dense(x)[0].array, rtol=0, atol=1e-10)
    return sum(r["logs"] for r in results)


def _train_and_check(tmp_path, world, backend, shape, schedule, data_parallel, micro,
                     timeout=180):
    """Every rank's results of a run on ``shape``, checked against the dense process;
    returns them and how many ranks print."""
    dense, dense_losses = _dense_run()
    results = run_ranks(_train, world, backend, timeout=timeout,
                        args=(shape, schedule, data_parallel, micro, str(tmp_path)))
    return results, _check(results, dense, dense_losses)


def _check_printed(results, pp):
    """Only the ranks at dp = 0 and tp = 0 print, each its stage's line per step."""
    printing = []
    for r in results:
        at = r["coordinate"]
        if at["dp"] == 0 and at["tp"] == 0:
            printing.append(at["pp"])
            expected = "".join(f"[pp {at['pp']}/{pp}] step {s} loss {loss:.6f}\n"
                               for s, loss in enumerate(r["losses"]))
            assert r["printed"] == expected, (at, r["printed"])
        else:
            assert r["printed"] == "", (at, r["printed"])
    assert sorted(printing) == list(range(pp)), printing


@pytest.mark.timeout(300)
def test_eight_ranks_two_by_two_by_two_match_one_dense_process(tmp_path):
    results, printing = _train_and_check(tmp_path, 8, "shm", (2, 2, 2), "1f1b", "ddp", 2, 240)
    assert printing == 2  # one printing rank per pipeline stage (dp = 0, tp = 0)
    # dp = 2: each piece in a DDP whose buckets average during its last backward only, not
    # once per micro-batch: the stage's one bucket is launched once a step
    assert all(r["overlapped"] and r["launches"] == 1 for r in results), [
        (r["overlapped"], r["launches"]) for r in results]
    _check_printed(results, pp=2)


@pytest.mark.timeout(300)
def test_zero1_on_eight_ranks_two_by_two_by_two(tmp_path):
    # ZeRO-1 over the dp group of each (tp, pp) position: each of its dp ranks keeps the
    # optimizer state of part of that position's tensor-parallel shard
    results, _ = _train_and_check(tmp_path, 8, "shm", (2, 2, 2), "gpipe", "zero1", 4, 240)
    _check_printed(results, pp=2)


@pytest.mark.timeout(300)
def test_zero1_and_the_interleaved_schedule_on_four_ranks(tmp_path):
    _train_and_check(tmp_path, 4, "shm", (2, 1, 2), "interleaved", "zero1", 2)


@pytest.mark.timeout(200)
def test_replicas_whose_pieces_share_the_tied_embedding_average_after_backward(tmp_path):
    # pp = 1 with two interleaved chunks: both pieces of a rank hold the tied embedding, which
    # two DDPs would each average; GPT3D then all-reduces once after the pipeline's backward
    results, _ = _train_and_check(tmp_path, 2, "shm", (2, 1, 1), "interleaved", "ddp", 2)
    assert not any(r["overlapped"] for r in results)


@pytest.mark.timeout(200)
def test_tcp_with_gpipe_on_a_tp_by_pp_mesh(tmp_path):
    _train_and_check(tmp_path, 4, "tcp", (1, 2, 2), "gpipe", "ddp", 4)


def _misuse(rank, world_size):
    from neural_arch.distributed import init_device_mesh
    from neural_arch.distributed.parallel3d import GPT3D
    from neural_arch.models.gpt import GPTConfig
    errors = []
    flat = init_device_mesh((2,), mesh_dim_names=("dp",))
    try:
        GPT3D(GPTConfig(**SIZES), flat, 2)
    except ValueError as exc:
        errors.append(str(exc))
    mesh = init_device_mesh((2, 1, 1), mesh_dim_names=("dp", "tp", "pp"))
    try:
        GPT3D(GPTConfig(**SIZES), mesh, 2, max_grad_norm=0.0)
    except ValueError as exc:
        errors.append(str(exc))
    model = GPT3D(GPTConfig(**SIZES), mesh, 2)
    x, y = np.zeros((6, 8), np.int64), np.zeros((6, 8), np.int64)
    try:
        model.train_step(x, y)
    except ValueError as exc:
        errors.append(str(exc))
    return errors


def test_misuse_is_named():
    for errors in run_ranks(_misuse, 2, "shm", timeout=60):
        assert "('dp', 'tp', 'pp')" in errors[0] and "('dp',)" in errors[0]
        assert errors[1] == "max_grad_norm must be a positive number or None, got 0.0"
        assert "6 rows" in errors[2] and "dp=2" in errors[2] and "2 micro-batches" in errors[2]
