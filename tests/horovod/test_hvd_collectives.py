"""Horovod's collectives (``neural_arch.horovod``) against NumPy, on every installed transport:
allreduce (Average, Sum, scale factors, fp16, in place, Tensors), allgather with a different
first dimension on every rank, broadcast, the async forms with poll/synchronize, and the
object collectives."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(240)
WORLD = 3


def rank_data(rank: int) -> np.ndarray:
    return np.random.default_rng(40 + rank).standard_normal((3, 4))


def collectives_case(rank: int, world: int) -> dict:
    import neural_arch.horovod as hvd
    from neural_arch.core import Tensor
    hvd.init()
    x = rank_data(rank)
    out = {"rank": hvd.rank(), "size": hvd.size(), "local": (hvd.local_rank(), hvd.local_size()),
           "cross": (hvd.cross_rank(), hvd.cross_size())}
    out["average"] = hvd.allreduce(x)
    out["sum"] = hvd.allreduce(x, op=hvd.Sum)
    out["average_flag"] = hvd.allreduce(x, average=False)  # the deprecated flag: a sum
    out["scaled"] = hvd.allreduce(x, op=hvd.Sum, prescale_factor=0.5, postscale_factor=3.0)
    out["fp16"] = hvd.allreduce(x.astype(np.float32), compression=hvd.Compression.fp16)
    out["ints"] = hvd.allreduce(np.arange(5, dtype=np.int64) * (rank + 1), op=hvd.Sum)
    t = Tensor(x.copy())
    result = hvd.allreduce(t)
    out["tensor_kind"] = (type(result).__name__, np.array_equal(t.array, x))  # input untouched
    inplace = x.copy()
    out["inplace_same"] = hvd.allreduce_(inplace) is inplace
    out["inplace"] = inplace
    rows = np.full((rank + 1, 2), float(rank)) + np.arange(2)  # rank r sends r + 1 rows
    out["gathered"] = hvd.allgather(rows)
    out["gathered_tensor"] = type(hvd.allgather(Tensor(rows))).__name__
    out["empty_rows"] = hvd.allgather(np.ones((0 if rank == 1 else 2, 3)))
    out["broadcast"] = hvd.broadcast(x, root_rank=1)
    b = x.copy()
    hvd.broadcast_(b, root_rank=2)
    out["broadcast_"] = b
    handles = [hvd.allreduce_async(x, op=hvd.Sum), hvd.allgather_async(rows),
               hvd.broadcast_async(x, 0), hvd.allreduce_async_(x.copy())]
    results = [hvd.synchronize(h) for h in handles]
    out["async"] = results
    out["polled"] = [hvd.poll(h) for h in handles]
    out["object"] = hvd.broadcast_object({"rank": rank, "list": [rank] * 2}, root_rank=1)
    out["objects"] = hvd.allgather_object(("r", rank))
    hvd.shutdown()
    return out


def test_collectives_match_numpy_on_every_transport(backend):
    results = run_ranks(collectives_case, WORLD, backend, timeout=200)
    xs = [rank_data(r) for r in range(WORLD)]
    total = np.sum(xs, axis=0)
    rows = np.concatenate([np.full((r + 1, 2), float(r)) + np.arange(2) for r in range(WORLD)])
    # one node: the local ranks are 0..WORLD-1 (mpiexec may number them in another order)
    assert sorted(out["local"][0] for out in results) == list(range(WORLD))
    for rank, out in enumerate(results):
        assert out["rank"] == rank and out["size"] == WORLD
        assert out["local"][1] == WORLD and out["cross"] == (0, 1)
        np.testing.assert_allclose(out["average"], total / WORLD, rtol=1e-12)
        np.testing.assert_allclose(out["sum"], total, rtol=1e-12)
        np.testing.assert_allclose(out["average_flag"], total, rtol=1e-12)
        np.testing.assert_allclose(out["scaled"], total * 0.5 * 3.0, rtol=1e-12)
        assert out["fp16"].dtype == np.float32
        np.testing.assert_allclose(out["fp16"], total / WORLD, atol=5e-3)
        # ... and it did go through float16: the exact float32 average differs in rounding
        assert not np.allclose(out["fp16"], (total / WORLD).astype(np.float32), rtol=1e-6)
        np.testing.assert_array_equal(out["ints"], np.arange(5) * 6)
        assert out["tensor_kind"] == ("Tensor", True)
        assert out["inplace_same"]
        np.testing.assert_allclose(out["inplace"], total / WORLD, rtol=1e-12)
        np.testing.assert_array_equal(out["gathered"], rows)
        assert out["gathered_tensor"] == "Tensor"
        assert out["empty_rows"].shape == (4, 3)
        np.testing.assert_array_equal(out["broadcast"], xs[1])
        np.testing.assert_array_equal(out["broadcast_"], xs[2])
        np.testing.assert_allclose(out["async"][0], total, rtol=1e-12)
        np.testing.assert_array_equal(out["async"][1], rows)
        np.testing.assert_array_equal(out["async"][2], xs[0])
        np.testing.assert_allclose(out["async"][3], total / WORLD, rtol=1e-12)
        assert out["polled"] == [True] * 4
        assert out["object"] == {"rank": 1, "list": [1, 1]}
        assert out["objects"] == [("r", r) for r in range(WORLD)]


def horovod_variables_only(rank: int, world: int) -> dict:
    """No RANK/WORLD_SIZE, only Horovod's variables: init() joins with them, owns the process
    group it made, and shutdown() destroys it."""
    import os

    import neural_arch.horovod as hvd
    from neural_arch import distributed as dist
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    os.environ.update(HOROVOD_RANK=str(rank), HOROVOD_SIZE=str(world),
                      HOROVOD_LOCAL_RANK="0", HOROVOD_LOCAL_SIZE="1",
                      HOROVOD_CROSS_RANK=str(rank), HOROVOD_CROSS_SIZE=str(world))
    hvd.init()
    hvd.init()  # a second call does nothing, as in Horovod
    out = {"layout": [hvd.rank(), hvd.size(), hvd.local_rank(), hvd.local_size(),
                      hvd.cross_rank(), hvd.cross_size()],
           "sum": float(hvd.allreduce(np.ones(1), op=hvd.Sum)[0])}
    hvd.shutdown()
    out["after"] = (hvd.is_initialized(), dist.is_initialized())
    return out


def test_init_from_horovods_variables_alone():
    results = run_ranks(horovod_variables_only, 2, "none", timeout=100)
    for rank, out in enumerate(results):
        assert out == {"layout": [rank, 2, 0, 1, rank, 2], "sum": 2.0, "after": (False, False)}
