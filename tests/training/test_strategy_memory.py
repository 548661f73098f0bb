"""What the sharded strategies hold per rank, measured on real processes: ZeRO-1's optimizer
state is 1/N of the elements whatever the parameters' sizes, and at rest between steps FSDP
and ZeRO-1 hold their model states and nothing more (tracemalloc); a finished asynchronous
collective does not keep its buffers alive."""
import gc

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(60)
SIZES = [256, 512, 512, 10]  # a 512 x 512 weight: no split of whole parameters is even
PSI = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:]))


def at_rest_worker(rank, world_size, name):
    """Traced bytes held after two steps (from before the model was built), the optimizer
    state's elements on this rank."""
    import tracemalloc

    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    from neural_arch.optim import Adam
    from neural_arch.training import TrainingConfig
    from neural_arch.training.strategies import FullyShardedDataParallel, ZeroOne
    def run(sizes, steps):
        rng = np.random.default_rng(rank)
        batch = (rng.standard_normal((8, sizes[0])).astype(np.float32),
                 rng.integers(0, sizes[-1], 8))
        manual_seed(0)
        model = MLP(sizes)
        strategy = ZeroOne() if name == "zero1" else FullyShardedDataParallel(stage=3)
        strategy.setup(model, Adam(model.parameters(), lr=1e-3), TrainingConfig(
            verbose=False, progress_bar=False), None)
        for _ in range(steps):
            strategy.training_step(batch, F.cross_entropy)
        return strategy
    run([4, 4, 2], 2)  # what a first use allocates for good (imports, plans) is not the model's
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    strategy = run(SIZES, 2)
    gc.collect()
    held = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    opt = getattr(strategy.optimizer, "optim", strategy.optimizer)
    state = sum(v.size for p in opt.state for v in opt.state[p].values()
                if isinstance(v, np.ndarray))
    return held, state


def test_zero1_holds_the_state_of_one_nth_of_the_elements():
    shard = -(-PSI // 2)
    for held, state in run_ranks(at_rest_worker, 2, "shm", args=("zero1",)):
        assert state == 2 * shard  # Adam's two moments of this rank's shard
        # parameters and the gradient buffer (4Ψ each), the moments (8Ψ/N); slack for the
        # model's small objects
        assert held <= (8 * PSI + 8 * shard) * 1.02, held


def test_fsdp3_holds_no_full_gradient_at_rest():
    shard = -(-PSI // 2)
    for held, state in run_ranks(at_rest_worker, 2, "shm", args=("fsdp3",)):
        assert state == 2 * shard
        # the parameters' shard (4Ψ/N) and the moments (8Ψ/N): no flat gradient of the model
        assert held <= 12 * shard * 1.1, held


def async_buffer_worker(rank, world_size):
    """Traced bytes left once an asynchronous all-reduce of 8 MiB has finished and its
    buffer and Work were dropped."""
    import tracemalloc

    from neural_arch import distributed as dist
    from neural_arch.distributed.group.world import world
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    buffer = np.ones(1 << 21, np.float32)
    work = dist.all_reduce(buffer, async_op=True)
    work.wait()
    del work, buffer
    world().queue.drain()
    gc.collect()
    left = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    return left


def test_a_finished_async_collective_keeps_no_buffer():
    # the 8 MiB message must be gone; what may stay is the transport's bounded scratch (a
    # two-rank tcp world keeps one 1 MiB piece buffer for the peer's pieces between calls)
    for left in run_ranks(async_buffer_worker, 2, "tcp"):
        assert left < 2 << 20, left
