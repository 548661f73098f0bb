"""Checks of the training tools: DistributedDataParallel against one process trained on the
concatenated batch, DistributedSampler's shares, and checkpoint/resume through files."""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

import neural_arch.functional as F
from neural_arch import distributed as dist
from neural_arch.core import Tensor, manual_seed
from neural_arch.models import MLP
from neural_arch.nn import load_state_dict_file, save_state_dict
from neural_arch.optim import SGD, Adam
from validation_checks import Context, Problems, agree_across_ranks, digest

STEPS, PER_RANK, IN, HIDDEN, OUT = 6, 5, 6, 8, 3
RTOL, ATOL = 1e-9, 1e-12
REFERENCE_SEED = 10  # rank 0's seed: DDP copies rank 0's weights to every rank


def make_model(seed: int) -> MLP:
    manual_seed(seed)
    model = MLP([IN, HIDDEN, HIDDEN, OUT], activation="tanh")
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def make_optimizer(name: str, params, lr: float = 0.0):
    if name == "sgd":
        return SGD(params, lr=lr or 0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    return Adam(params, lr=lr or 0.01)


def batches(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    return (rng.standard_normal((STEPS, n * PER_RANK, IN)),
            rng.integers(0, OUT, size=(STEPS, n * PER_RANK)))


def train_step(model, optimizer, x: np.ndarray, y: np.ndarray) -> None:
    optimizer.zero_grad()
    F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
    if isinstance(model, dist.DistributedDataParallel):
        model.sync_gradients()
    optimizer.step()


def parameters_of(model) -> list[np.ndarray]:
    module = getattr(model, "module", model)
    return [p.array.copy() for p in module.parameters()]


def reference_run(n: int, optimizer_name: str, steps: int = STEPS) -> list[np.ndarray]:
    """One process, the whole batch of all ranks, no communication."""
    model = make_model(REFERENCE_SEED)
    optimizer = make_optimizer(optimizer_name, model.parameters())
    xs, ys = batches(n)
    for step in range(steps):
        train_step(model, optimizer, xs[step], ys[step])
    return parameters_of(model)


def my_share(ctx: Context, xs: np.ndarray, ys: np.ndarray, step: int, check: str):
    part = slice(ctx.rank * PER_RANK, (ctx.rank + 1) * PER_RANK)
    x = xs[step][part] + (1.0 if ctx.corrupt(check) else 0.0)
    return x, ys[step][part]


def compare_to_reference(got, want, problems: Problems, what: str) -> float:
    worst = 0.0
    for i, (a, b) in enumerate(zip(got, want)):
        worst = max(worst, float(np.max(np.abs(a - b) / (np.abs(b) + ATOL / RTOL), initial=0.0)))
        if not np.allclose(a, b, rtol=RTOL, atol=ATOL):
            problems.add(f"{what}: parameter {i} differs by up to "
                         f"{float(np.max(np.abs(a - b))):.3g}")
    return worst


def _ddp_check(ctx: Context, auto_sync: bool, optimizer_name: str, check: str) -> str:
    problems, n = Problems(), ctx.world_size
    model = dist.DistributedDataParallel(make_model(REFERENCE_SEED + ctx.rank),
                                         auto_sync=auto_sync, bucket_size_mb=0.0005)
    optimizer = make_optimizer(optimizer_name, model.parameters())
    xs, ys = batches(n)
    for step in range(STEPS):
        train_step(model, optimizer, *my_share(ctx, xs, ys, step, check))
    params = parameters_of(model)
    agree_across_ranks(digest(*params), "parameters", problems)
    worst = compare_to_reference(params, reference_run(n, optimizer_name), problems,
                                 f"after {STEPS} steps")
    mode = "automatic (hooks)" if auto_sync else "manual sync_gradients()"
    return problems.verdict(f"{mode}, {optimizer_name}, float64: {STEPS} steps of {n} x "
                            f"{PER_RANK} samples equal one process on the whole batch (max rel "
                            f"diff {worst:.1e}); parameters bit-identical on all ranks")


def check_ddp_manual(ctx: Context) -> str:
    return _ddp_check(ctx, False, "sgd", "ddp_manual")


def check_ddp_automatic(ctx: Context) -> str:
    return _ddp_check(ctx, True, "adam", "ddp_automatic")


def check_sampling(ctx: Context) -> str:
    n, problems, cases = ctx.world_size, Problems(), 0
    for size in (10 * n + 3, 12 * n):
        for epoch in (0, 1):
            for drop_last in (True, False):
                sampler = dist.DistributedSampler(size, shuffle=True, seed=7, drop_last=drop_last)
                sampler.set_epoch(epoch)
                mine = [int(i) for i in sampler]
                if ctx.corrupt("sampling"):
                    mine = [(i + 1) % size for i in mine]
                shares = dist.all_gather_object(mine)
                flat = [i for share in shares for i in share]
                what = f"size {size} epoch {epoch} drop_last={drop_last}"
                per_rank = size // n if drop_last else math.ceil(size / n)
                problems.expect(all(len(s) == per_rank == len(sampler) for s in shares),
                                f"{what}: share lengths {[len(s) for s in shares]}, expected "
                                f"{per_rank} each")
                problems.expect(all(0 <= i < size for i in flat), f"{what}: index out of range")
                if drop_last:
                    problems.expect(len(set(flat)) == len(flat),
                                    f"{what}: shares overlap ({len(flat) - len(set(flat))} "
                                    "repeated indices)")
                if not drop_last or size % n == 0:
                    problems.expect(set(flat) == set(range(size)),
                                    f"{what}: {size - len(set(flat))} indices in no share")
                cases += 1
    return problems.verdict(f"{cases} cases (sizes {10 * n + 3} and {12 * n}, 2 epochs, drop_last "
                            "on/off): equal shares, disjoint with drop_last, covering the data set")


# ----- checkpoint ------------------------------------------------------------------------------
def save_optimizer(optimizer, directory: Path) -> None:
    """Arrays to safetensors, everything else to JSON: no pickle on disk."""
    state = optimizer.state_dict()
    arrays, scalars = {}, {}
    for index, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, np.ndarray):
                arrays[f"{index}.{key}"] = value
            else:
                scalars.setdefault(str(index), {})[key] = value
    save_state_dict(arrays, directory / "optimizer.safetensors")
    meta = {"param_groups": state["param_groups"], "scalars": scalars}
    (directory / "optimizer.json").write_text(
        json.dumps(meta, default=lambda v: v.item() if hasattr(v, "item") else str(v)))


def load_optimizer(optimizer, directory: Path) -> None:
    meta = json.loads((directory / "optimizer.json").read_text())
    state: dict = {}
    for name, array in load_state_dict_file(directory / "optimizer.safetensors").items():
        index, key = name.split(".", 1)
        state.setdefault(int(index), {})[key] = array
    for index, entries in meta["scalars"].items():
        state.setdefault(int(index), {}).update(entries)
    groups = [{k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
              for g in meta["param_groups"]]
    optimizer.load_state_dict({"state": state, "param_groups": groups})


def optimizer_digest(optimizer) -> str:
    state = optimizer.state_dict()
    arrays = [v for i in sorted(state["state"]) for _, v in sorted(state["state"][i].items())
              if isinstance(v, np.ndarray)]
    scalars = [(i, k, v) for i in sorted(state["state"])
               for k, v in sorted(state["state"][i].items()) if not isinstance(v, np.ndarray)]
    groups = [{k: v for k, v in g.items() if k != "params"} for g in state["param_groups"]]
    return digest(*arrays) + repr(scalars) + repr(groups)


def check_checkpoint(ctx: Context) -> str:
    """Train, save on rank 0, load on every rank into fresh objects, train on: the resumed run
    must equal the uninterrupted one bit for bit."""
    problems, n, half = Problems(), ctx.world_size, STEPS // 2
    directory = ctx.work_dir / "checkpoint"
    xs, ys = batches(n)
    model = dist.DistributedDataParallel(make_model(REFERENCE_SEED + ctx.rank))
    optimizer = make_optimizer("adam", model.parameters())
    for step in range(half):
        train_step(model, optimizer, *my_share(ctx, xs, ys, step, ""))
    if ctx.rank == 0:
        directory.mkdir(exist_ok=True)
        save_state_dict(model.module, directory / "model.safetensors")
        save_optimizer(optimizer, directory)
    dist.barrier()
    fresh = make_model(1000 + ctx.rank)  # other weights, so a load that does nothing shows
    fresh.load_state_dict(load_state_dict_file(directory / "model.safetensors"))
    fresh_optimizer = make_optimizer("adam", fresh.parameters(), lr=0.5)  # the file restores lr
    load_optimizer(fresh_optimizer, directory)
    # Compared before DistributedDataParallel would copy rank 0's weights over a bad load.
    problems.expect(digest(*parameters_of(fresh)) == digest(*parameters_of(model)),
                    "loaded parameters differ from the saved ones")
    problems.expect(optimizer_digest(fresh_optimizer) == optimizer_digest(optimizer),
                    "loaded optimizer state differs from the saved one")
    if ctx.corrupt("checkpoint"):
        fresh_optimizer.state[next(fresh.parameters())]["exp_avg"] += 1e-3
    resumed = dist.DistributedDataParallel(fresh)
    for step in range(half, STEPS):
        share = my_share(ctx, xs, ys, step, "")
        train_step(model, optimizer, *share)
        train_step(resumed, fresh_optimizer, *share)
    final = parameters_of(resumed)
    problems.expect(digest(*final) == digest(*parameters_of(model)),
                    f"resumed run differs from the uninterrupted one after {STEPS} steps")
    agree_across_ranks(digest(*final), "resumed parameters", problems)
    return problems.verdict(f"Adam state (safetensors + JSON) saved after {half} steps, loaded on "
                            f"all {n} ranks; {STEPS - half} more steps equal the uninterrupted run "
                            "bit for bit")
