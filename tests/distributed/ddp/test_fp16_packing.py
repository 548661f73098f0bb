"""DDP under ``fp16_compress_hook`` packs gradients straight into float16 buckets and unpacks
from them: the same bits as the hook run on float32 buckets (cast, average, cast back), the
same bytes counted, and on shared memory the NumPy reference of its float16 average (every
rank's float16 value added in float32 in rank order, divided once, rounded once). On shared
memory those float16 buckets are shared ones (averaged in the segment, no collective), and
the hook behind a wrapper runs on private ones: the two must agree bit for bit.
"""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)

# weights of 40 x 30 and 30 x 10 (compiled casts from 1024 elements on) and their biases
SIZES = (40, 30, 10)
STEPS = 2


def _as_is(state, bucket):
    """``fp16_compress_hook`` behind a wrapper: DDP cannot see which hook runs, so it packs
    the bucket in the parameters' dtype and the hook casts (the path before packing cast)."""
    from neural_arch.distributed.comm_hooks import fp16_compress_hook
    return fp16_compress_hook(state, bucket)


def _model(dtype):
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(5)
    model = MLP(list(SIZES))
    for p in model.parameters():
        p.array = p.array.astype(dtype)
    return model


def _gradients(rng, params, dtype):
    # magnitudes from float16's subnormals to beyond its range (inf after the sum) and a NaN
    grads = []
    for p in params:
        g = rng.standard_normal(p.array.shape) * 10.0 ** rng.integers(-7, 4, p.array.shape)
        grads.append(g.astype(dtype))
    with np.errstate(over="ignore"):  # 70000 is inf already in float16 parameters
        grads[0].reshape(-1)[:3] = [70000.0, 6e-8, np.nan]
    return grads


def packing_worker(rank: int, world_size: int, dtype_name: str):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.comm_hooks import CommHookState, fp16_compress_hook
    dtype = np.dtype(dtype_name)
    out = {}
    for kind, hook in (("packed", fp16_compress_hook), ("hooked", _as_is)):
        # buckets of about 1 KB of float32 (half that of float16): more than one
        model = DistributedDataParallel(_model(dtype), auto_sync=False,
                                        bucket_size_mb=0.00025 * min(dtype.itemsize, 4),
                                        find_unused_parameters=True)
        state = CommHookState()
        model.register_comm_hook(state, hook)
        rng = np.random.default_rng(40 + rank)
        steps = []
        for step in range(STEPS):
            grads = _gradients(rng, list(model.module.parameters()), dtype)
            for p, g in zip(model.module.parameters(), grads):
                p.grad = g.copy()
            if step == 1:  # a parameter no rank gave a gradient keeps None
                list(model.module.parameters())[-1].grad = None
            with np.errstate(over="ignore", invalid="ignore"):
                model.sync_gradients()
            steps.append((grads, [None if p.grad is None else p.grad.array.copy()
                                  for p in model.module.parameters()]))
        out[kind] = {"steps": steps, "bytes": state.last_step_bytes, "iter": state.iter,
                     "wires": [b.flat.dtype.name for b in model._buckets],
                     "buckets": len(model._buckets), "shared": model.shared_buckets}
    return out


def _shm_reference(inputs, dtype):
    """The float16 average shared memory computes: each rank's value rounded to float16, the
    p values added in float32 in rank order, divided by p, rounded once to float16."""
    with np.errstate(over="ignore", invalid="ignore"):
        total = inputs[0].astype(np.float16).astype(np.float32)
        for other in inputs[1:]:
            total = total + other.astype(np.float16).astype(np.float32)
        return (total / np.float32(len(inputs))).astype(np.float16).astype(dtype)


# float16 parameters: buckets already in the wire's dtype (shared ones sum as the direct
# all-reduce of float16 does, all ranks in float32, rounded once)
CASES = [(backend, world_size, dtype_name) for backend in ("shm", "tcp") for world_size in (2, 3)
         for dtype_name in ("float32", "float64")] + [("shm", 2, "float16"), ("shm", 3, "float16")]


@pytest.mark.parametrize("backend, world_size, dtype_name", CASES)
def test_packing_in_float16_gives_the_hooks_bits(backend, world_size, dtype_name):
    results = run_ranks(packing_worker, world_size, backend, args=(dtype_name,), timeout=90)
    for out in results:
        packed, hooked = out["packed"], out["hooked"]
        assert packed["buckets"] > 1
        assert packed["shared"] == (backend == "shm") and not hooked["shared"]
        # the buckets are the float16 copies themselves; the wrapped hook gets them whole
        assert set(packed["wires"]) == {"float16"}, packed["wires"]
        assert set(hooked["wires"]) == {dtype_name}
        assert packed["bytes"] == hooked["bytes"] == sum(
            a * b + b for a, b in zip(SIZES[:-1], SIZES[1:])) * 2
        assert packed["iter"] == hooked["iter"] == STEPS
        for step, ((_, fused), (_, plain)) in enumerate(zip(packed["steps"], hooked["steps"])):
            assert (fused[-1] is None) == (plain[-1] is None) == (step == 1)
            for a, b in zip(fused[:-1] if step == 1 else fused, plain):
                assert a.dtype == b.dtype == np.dtype(dtype_name)
                assert a.tobytes() == b.tobytes()
    if backend == "shm":
        for step in range(STEPS):
            for i in range(len(SIZES) * 2 - 2 - (step == 1)):
                inputs = [out["packed"]["steps"][step][0][i] for out in results]
                want = _shm_reference(inputs, np.dtype(dtype_name))
                got = results[0]["packed"]["steps"][step][1][i]
                assert got.tobytes() == want.tobytes(), f"step {step}, parameter {i}"


def backward_worker(rank: int, world_size: int):
    """Two steps of real backward with the buckets launched during it (auto_sync), packed in
    float16 and through the wrapped hook; the gradients after each."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.comm_hooks import fp16_compress_hook
    rng = np.random.default_rng(60 + rank)
    x = rng.standard_normal((8, SIZES[0])).astype(np.float32)
    y = rng.integers(0, SIZES[-1], 8)
    out = {}
    for kind, hook in (("packed", fp16_compress_hook), ("hooked", _as_is)):
        model = DistributedDataParallel(_model(np.float32), bucket_size_mb=0.001)
        model.register_comm_hook(None, hook)
        grads = [model.shared_buckets]
        for _ in range(2):
            for p in model.module.parameters():
                p.grad = None
            F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
            grads.append([p.grad.array.copy() for p in model.module.parameters()])
        out[kind] = grads
    return out


def test_packing_during_backward_gives_the_hooks_bits():
    for out in run_ranks(backward_worker, 2, "shm", timeout=60):
        # shared float16 buckets, packed and unpacked on the queue's thread during backward
        assert out["packed"].pop(0) is True and out["hooked"].pop(0) is False
        for fused, plain in zip(out["packed"], out["hooked"]):
            for a, b in zip(fused, plain):
                assert a.dtype == np.float32 and a.tobytes() == b.tobytes()
            assert all(np.array_equal(a, a.astype(np.float16)) for a in fused)  # went through it
