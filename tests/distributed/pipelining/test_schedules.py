"""Every schedule trains like one dense model: same losses, same parameters (float64).

One job per (schedule, pipeline size) loops over the micro-batch counts inside the ranks, so
the grid stays quick; shm carries the grid, one case runs on every transport.
"""
import numpy as np
import pytest

from dist_harness import run_ranks
from neural_arch.distributed.pipelining.plan import build_plan
from pipeline_cases import BATCH, batch, compare, make_mlp, mse, train_dense, train_pipeline

STEPS = 3
MICROBATCHES = (1, 2, 4, 8)


def _opt_for(m):
    return "sgd" if m in (1, 4) else "adamw"


def _batches(m):
    """STEPS batches that split into m micro-batches: BATCH rows, or 3 per micro-batch."""
    rows = BATCH if BATCH % m == 0 else 3 * m
    return [batch(s, n=rows) for s in range(STEPS)]


def _grid(rank, world_size, kind, counts, v):
    out = {}
    for m in counts:
        losses, params, schedule = train_pipeline(rank, world_size, make_mlp(), kind, m,
                                                  _batches(m), mse, _opt_for(m), v)
        out[m] = (losses, params, schedule.peak_activations)
    return out


def _check(results, counts, kind, p):
    for m in counts:
        dense_losses, dense_params = train_dense(make_mlp(), _batches(m), mse, _opt_for(m))
        compare([r[m] for r in results], dense_losses, dense_params)
        peaks = [r[m][2] for r in results]
        if kind == "gpipe":
            assert peaks == [m] * p, peaks
        elif kind == "1f1b":  # stage s holds at most p - s micro-batches
            assert peaks == [min(p - s, m) for s in range(p)], peaks
        else:  # what the plan's clock says each rank holds, over both its chunks
            assert peaks == build_plan(kind, p, m, 2).peak, peaks


@pytest.mark.parametrize("p", [2, 3, 4])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b"])
def test_schedule_matches_dense_training(kind, p):
    results = run_ranks(_grid, p, "shm", timeout=120, args=(kind, MICROBATCHES, 1))
    _check(results, MICROBATCHES, kind, p)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_interleaved_with_two_chunks_per_rank_matches_dense_training(p):
    # Any count, divisible by p or not: m < p is one round shorter than the ring, m = p
    # Megatron-LM's all-warm-up case, 2p + 1 two rounds of unequal size (p + 1, then p).
    counts = tuple(sorted(set(MICROBATCHES) | {p, 2 * p + 1}))
    results = run_ranks(_grid, p, "shm", timeout=120, args=("interleaved", counts, 2))
    _check(results, counts, "interleaved", p)


def test_1f1b_on_every_transport(backend):
    results = run_ranks(_grid, 2, backend, timeout=120, args=("1f1b", (4,), 1))
    _check(results, (4,), "1f1b", 2)


def test_interleaved_on_every_transport(backend):
    results = run_ranks(_grid, 2, backend, timeout=120, args=("interleaved", (4,), 2))
    _check(results, (4,), "interleaved", 2)


def _single(rank, world_size):
    out = {}
    for kind, v in (("gpipe", 1), ("1f1b", 1), ("interleaved", 3)):
        out[kind] = train_pipeline(rank, world_size, make_mlp(), kind, 4,
                                   [batch(s) for s in range(STEPS)], mse, "sgd", v)[:2]
    return out


def test_one_rank_runs_every_schedule():
    (result,) = run_ranks(_single, 1, "shm", timeout=60)
    dense = train_dense(make_mlp(), [batch(s) for s in range(STEPS)], mse, "sgd")
    for kind in ("gpipe", "1f1b", "interleaved"):
        compare([result[kind]], *dense)



def _wide_case(v):
    """Activations of 4 MiB per micro-batch (8192 rows of 64 float64: more than a
    shared-memory ring holds, far past MPI's eager limit)."""
    from neural_arch.nn import Linear, Sequential
    rng = np.random.default_rng(3)
    model = Sequential(*[Linear(64, 64, dtype=np.float64) for _ in range(2 * v)])
    for p in model.parameters():
        p.array[...] = rng.standard_normal(p.array.shape) / 8
    x, y = rng.standard_normal((4 * 8192, 64)), rng.standard_normal((4 * 8192, 64))
    return model, [(x, y)]


def _wide(rank, world_size, kind, v):
    model, batches = _wide_case(v)
    return train_pipeline(rank, world_size, model, kind, 4, batches, mse, "sgd", v)[:2]


@pytest.mark.parametrize("kind,v", [("1f1b", 1), ("interleaved", 2)])
def test_large_activations_cross_without_deadlock(backend, kind, v):
    """In 1F1B's steady state, and around the interleaved schedule's wrap-around, both
    neighbours send each other such messages at once."""
    results = run_ranks(_wide, 2, backend, timeout=180, args=(kind, v))
    model, batches = _wide_case(v)
    compare(results, *train_dense(model, batches, mse, "sgd"), tol=1e-9)
