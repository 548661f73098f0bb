"""The last bucket a sync launches itself averages on the syncing thread: that thread would only
wait for the communication thread's collective, so DDP's own average and the plain hooks
(``allreduce_hook``, ``fp16_compress_hook``) run it synchronously. Earlier buckets still go
through the queue (their averaging overlaps the next bucket's packing); the bits are the same.
"""
from __future__ import annotations

import threading

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(60)

SIZES = (40, 30, 10)  # weights of 1200 and 300 values (compiled casts) and small biases


def _queue_started() -> bool:
    return any(t.name.startswith("neural_arch-collectives-") for t in threading.enumerate())


def here_worker(rank: int, world_size: int):
    from neural_arch.core import manual_seed
    from neural_arch.distributed import DistributedDataParallel, all_gather_object
    from neural_arch.distributed.comm_hooks import CommHookState, fp16_compress_hook
    from neural_arch.models import MLP
    out = {}
    for kind, mb in (("none", 25), ("fp16", 25), ("fp16, several buckets", 0.001)):
        manual_seed(3)
        model = DistributedDataParallel(MLP(list(SIZES)), auto_sync=False, bucket_size_mb=mb)
        if kind.startswith("fp16"):
            model.register_comm_hook(CommHookState(), fp16_compress_hook)
        rng = np.random.default_rng(rank)
        grads = [rng.standard_normal(p.array.shape).astype(np.float32)
                 for p in model.module.parameters()]
        for p, g in zip(model.module.parameters(), grads):
            p.grad = g.copy()
        model.sync_gradients()
        out[kind] = {"queued": _queue_started(), "buckets": len(model.bucket_parameters()),
                     "grads": [p.grad.array.copy() for p in model.module.parameters()],
                     "inputs": all_gather_object(grads)}
    return out


def _mean_of_two(a: np.ndarray, b: np.ndarray, wire) -> np.ndarray:
    """The two-rank tcp average: ``a + b`` (rank 0's operand first) in the wire dtype, halved;
    a float16 sum is the float32 sum rounded once (``reductions.kernels``)."""
    if wire == np.float16:
        total = (a.astype(np.float16).astype(np.float32)
                 + b.astype(np.float16).astype(np.float32)).astype(np.float16)
        return (total.astype(np.float32) * np.float32(0.5)).astype(np.float16).astype(a.dtype)
    return (a + b) * np.float32(0.5)


def test_the_last_bucket_averages_on_the_syncing_thread():
    results = run_ranks(here_worker, 2, "tcp", timeout=45)
    for out in results:
        # one bucket: its average never went through the communication thread's queue
        assert out["none"]["buckets"] == out["fp16"]["buckets"] == 1
        assert not out["none"]["queued"] and not out["fp16"]["queued"]
        # several: the earlier buckets did
        assert out["fp16, several buckets"]["buckets"] > 1
        assert out["fp16, several buckets"]["queued"]
        for kind, wire in (("none", np.float32), ("fp16", np.float16),
                           ("fp16, several buckets", np.float16)):
            first, second = out[kind]["inputs"]
            for got, a, b in zip(out[kind]["grads"], first, second):
                np.testing.assert_array_equal(got, _mean_of_two(a, b, wire), err_msg=kind)
