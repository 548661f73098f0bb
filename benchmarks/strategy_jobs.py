"""What one rank of ``bench_strategies`` runs: the Trainer's strategies on an MLP, timed
(DDP with communication overlapped against the explicit sync after backward) and measured
(memory per rank of each strategy).

Each strategy is built as the ``Trainer`` builds it (``strategy.setup(model, optimizer,
config, group)``) and stepped through ``strategy.training_step(batch, loss_fn)``, the call the
Trainer's loop makes per batch. ``TrainingConfig`` has no bucket size (DDP's default is 25 MB,
one bucket for these models), so the benchmark's config subclass sets it: several buckets, so
that the first ones can travel while backward computes the rest.
"""
from __future__ import annotations

import dataclasses
import gc
import time
from typing import Any, Dict, List, Optional

import bench_common as common

MiB = 1 << 20
MEMORY_STRATEGIES = ("single", "ddp", "zero1", "fsdp2", "fsdp3", "tensor_parallel")
# bytes sent per step: ZeRO-1 by reduce-scatter and, for comparison, over DDP's all-reduce
TRAFFIC_STRATEGIES = ("ddp", "zero1", "zero1_over_ddp", "fsdp2", "fsdp3")


def _config(bucket_mb: float) -> Any:
    from neural_arch.training import TrainingConfig

    @dataclasses.dataclass
    class BucketedConfig(TrainingConfig):
        bucket_size_mb: float = 25.0

        def data_parallel(self):
            return dataclasses.replace(super().data_parallel(), bucket_size_mb=self.bucket_size_mb)

    return BucketedConfig(progress_bar=False, verbose=False, bucket_size_mb=bucket_mb)


def _batch(job: Dict[str, Any], rank: int):
    import numpy as np
    rng = np.random.default_rng(1000 + rank)
    sizes = job["sizes"]
    x = rng.standard_normal((job["batch"], sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], job["batch"]).astype(np.int64)
    return x, y


def _mlp(sizes):
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(0)
    return MLP(sizes)


def _tp_mlp(sizes, tp_group):
    """The MLP with its hidden layers split over ``tp_group`` in column/row pairs (the last
    layer replicated), as Megatron splits a transformer's MLP."""
    from neural_arch.core import manual_seed
    from neural_arch.distributed.tensor_parallel.layers import (ColumnParallelLinear,
                                                                RowParallelLinear)
    from neural_arch.nn import Linear, ReLU, Sequential
    manual_seed(0)
    layers: List[Any] = []
    for i, (a, b) in enumerate(zip(sizes[:-2], sizes[1:-1])):
        if i % 2 == 0:
            layers += [ColumnParallelLinear(a, b, group=tp_group), ReLU()]
        else:
            layers += [RowParallelLinear(a, b, group=tp_group), ReLU()]
    if len(sizes) % 2 == 1:  # an odd number of hidden layers ends column-split: gather first
        layers[-2].gather_output = True
    layers.append(Linear(sizes[-2], sizes[-1]))
    return Sequential(*layers)


def build(name: str, job: Dict[str, Any], overlap: bool = True):
    """(strategy after setup, loss_fn) for ``name`` on the job's MLP at the world's size."""
    import neural_arch.functional as F
    from neural_arch import distributed as dist
    from neural_arch.optim import Adam
    from neural_arch.training import strategies as S
    config, group = _config(job["bucket_mb"]), None
    if name == "single":  # a group of this rank alone: "single" refuses several ranks
        groups = [dist.new_group([r]) for r in range(dist.get_world_size())]
        group, strategy = groups[dist.get_rank()], S.SingleProcess()
    elif name == "tensor_parallel":
        mesh = dist.init_device_mesh((1, dist.get_world_size()), mesh_dim_names=("dp", "tp"))
        group, strategy = mesh.get_group("dp"), S.TensorParallel()
    else:
        strategy = {"ddp": lambda: S.DataParallel(overlap=overlap), "zero1": S.ZeroOne,
                    "zero1_over_ddp": S.ZeroOne,
                    "fsdp2": lambda: S.FullyShardedDataParallel(stage=2),
                    "fsdp3": lambda: S.FullyShardedDataParallel(stage=3)}[name]()
        if name == "zero1_over_ddp":  # DDP's all-reduce + ZeroRedundancyOptimizer
            strategy.reduce_scatter = False
    model = _tp_mlp(job["sizes"], mesh.get_group("tp")) if name == "tensor_parallel" \
        else _mlp(job["sizes"])
    strategy.setup(model, Adam(model.parameters(), lr=1e-4), config, group)
    return strategy, F.cross_entropy


# ----- overlap against explicit sync -----------------------------------------------------------
def time_overlap(job: Dict[str, Any]) -> Dict[str, Any]:
    """Median step and waited communication (ms) of DDP overlapped and explicit, interleaved
    (the order flips every round), each step right after a barrier; the slowest rank's."""
    from neural_arch import distributed as dist
    batch = _batch(job, dist.get_rank())
    paths = {"overlap": build("ddp", job, overlap=True)[0],
             "explicit": build("ddp", job, overlap=False)[0]}
    loss_fn = _loss_fn()
    steps: Dict[str, List[float]] = {p: [] for p in paths}
    comm: Dict[str, List[float]] = {p: [] for p in paths}
    hidden: Dict[str, List[float]] = {p: [] for p in paths}
    for i in range(job["warmup"] + job["steps"]):
        for path in (list(paths) if i % 2 == 0 else list(reversed(list(paths)))):
            strategy = paths[path]
            before, hidden_before = strategy.comm_ms(), strategy.comm_hidden_ms()
            dist.barrier()
            start = time.perf_counter()
            strategy.training_step(batch, loss_fn)
            if i >= job["warmup"]:
                steps[path].append(time.perf_counter() - start)
                comm[path].append((strategy.comm_ms() - before) / 1e3)
                hidden[path].append((strategy.comm_hidden_ms() - hidden_before) / 1e3)
    everyone = dist.all_gather_object((steps, comm, hidden))
    buckets = len(paths["explicit"].wrapper.ddp._buckets)
    return {"buckets": buckets, **{
        path: {key: common.slowest_median([e[k][path] for e in everyone])
               for k, key in enumerate(("step", "comm", "hidden"))}
        for path in paths}}


# ----- bytes sent per step ---------------------------------------------------------------------
def measure_traffic(name: str, job: Dict[str, Any]) -> Dict[str, Any]:
    """Payload bytes this rank's transport sent per step (counted: ``transports.sent_bytes``; 0 where the
    collectives are shared memory's own) and the median step; the most loaded rank's."""
    from neural_arch import distributed as dist
    from neural_arch.distributed.transports.sent_bytes import counting_sent_bytes
    batch, loss_fn = _batch(job, dist.get_rank()), _loss_fn()
    strategy, _ = build(name, job)
    sent, steps = [], []
    for i in range(job["warmup"] + job["traffic_steps"]):
        dist.barrier()
        with counting_sent_bytes() as tally:
            start = time.perf_counter()
            strategy.training_step(batch, loss_fn)
            seconds = time.perf_counter() - start
        if i >= job["warmup"]:
            sent.append(tally.counted)
            steps.append(seconds)
    del strategy
    gc.collect()
    everyone = dist.all_gather_object((sent, steps))
    return {"strategy": name, "sent": max(max(s) for s, _ in everyone),
            "step": common.slowest_median([t for _, t in everyone])}


def _loss_fn():
    import neural_arch.functional as F
    return F.cross_entropy


# ----- memory per rank -------------------------------------------------------------------------
def _owner(array):
    """The array whose memory ``array`` views (itself when it owns its memory)."""
    while hasattr(getattr(array, "base", None), "nbytes"):
        array = array.base
    return array


def _nbytes(arrays) -> int:
    """Bytes of the memory behind ``arrays``: views of one buffer (ZeRO-1's flat parameters
    and gradients) count that buffer once."""
    seen, total = set(), 0
    for a in arrays:
        if a is None or not hasattr(a, "nbytes"):
            continue
        a = _owner(a)
        if id(a) not in seen:
            seen.add(id(a))
            total += a.nbytes
    return total


def _held(strategy) -> Dict[str, int]:
    """Bytes of the parameters, gradients and optimizer state this rank holds (each array
    counted once), and FSDP's gathered full parameters (memory maps tracemalloc misses)."""
    params = list(strategy.wrapper.parameters())
    optimizer = strategy.optimizer
    state = getattr(optimizer, "optim", optimizer).state
    fsdp = _fsdp(strategy)
    # ZeRO-1 by reduce-scatter: the gradients lie in flat buffers, the shards' are views
    flat = [f.grads for f in getattr(optimizer, "flats", ())]
    # FSDP stage 2's shards are slices of the gathered full parameters: counted there once
    return {"params": _nbytes(p.array for p in params if not _in_mapping(p.array)),
            "grads": _nbytes([p.grad.array for p in params if p.grad is not None] + flat),
            "optimizer": _nbytes(v for p in state for v in state[p].values()
                                 if getattr(v, "ndim", 0) > 0),
            "gathered": fsdp.memory_stats()["gathered_bytes"] if fsdp else 0}


def _held_at_step(strategy, step) -> Dict[str, int]:
    """``_held`` as the optimizer steps inside ``step()``: the moment parameters, gradients
    and optimizer state all exist (the step then zeroes the gradients)."""
    optimizer, held = strategy.optimizer, {}
    original = optimizer.step

    def counting_step(*args, **kwargs):
        held.update(_held(strategy))
        return original(*args, **kwargs)

    optimizer.step = counting_step
    try:
        step()
    finally:
        del optimizer.step  # the class's method again
    if not held:
        raise RuntimeError(f"strategy {strategy.name!r}: the optimizer did not step in a "
                           f"training step, nothing was counted")
    return held


def _in_mapping(array) -> bool:
    """Whether ``array`` views a memory map (FSDP's buffer of gathered parameters)."""
    import mmap
    while getattr(array, "base", None) is not None:
        array = array.base
        if isinstance(array, (mmap.mmap, memoryview)) and not hasattr(array, "base"):
            break
    return isinstance(array, mmap.mmap) or (isinstance(array, memoryview)
                                            and isinstance(array.obj, mmap.mmap))


def _fsdp(strategy) -> Optional[Any]:
    module = strategy.wrapper.module
    return module if hasattr(module, "memory_stats") else None


def measure_memory(name: str, job: Dict[str, Any]) -> Dict[str, Any]:
    """tracemalloc from before the model is built: bytes held after two steps (at rest, plus
    FSDP's gathered parameters) and the peak of a third step; the most loaded rank's."""
    import tracemalloc

    from neural_arch import distributed as dist
    batch, loss_fn = _batch(job, dist.get_rank()), _loss_fn()
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    strategy, _ = build(name, job)
    for _ in range(2):
        strategy.training_step(batch, loss_fn)
    gc.collect()
    fsdp = _fsdp(strategy)
    at_rest = tracemalloc.get_traced_memory()[0] - base + _held(strategy)["gathered"]
    tracemalloc.reset_peak()
    if fsdp:
        fsdp.reset_peak_memory_stats()
    held = _held_at_step(strategy, lambda: strategy.training_step(batch, loss_fn))
    peak = tracemalloc.get_traced_memory()[1] - base
    peak += fsdp.memory_stats()["peak_gathered_bytes"] if fsdp else 0
    tracemalloc.stop()
    psi_rank = sum(p.array.size for p in strategy.wrapper.module.parameters()) \
        if not fsdp else None
    mine = dict(held, at_rest=at_rest, peak=peak, psi_rank=psi_rank or 0)
    del strategy
    gc.collect()
    everyone = dist.all_gather_object(mine)
    return dict(strategy=name, **{k: max(r[k] for r in everyone) for k in mine})


def warm_up(job: Dict[str, Any]) -> None:
    """A step of every strategy on a tiny MLP first: what the first use allocates for good
    (imports, cached plans) is not the model's."""
    tiny = dict(job, sizes=[4, 4, 4, 2], batch=2)
    for name in job["memory_strategies"]:
        strategy, loss_fn = build(name, tiny)
        strategy.training_step(_batch(tiny, 0), loss_fn)
        del strategy
    gc.collect()
