"""What ``bench_conv.py`` times: the same convolutional network in neural_arch and in torch
(same architecture, ours' initial weights copied into torch), stepped in turn.

A step is zero_grad, forward, cross-entropy, backward and an SGD update; each phase is timed
on its own so that the report can say where the time goes. ``time_pair`` runs the two
models' steps interleaved (the order flips every step) so that noise on a shared machine hits
both alike. ``ddp_worker`` is one rank of the p = 2 job: both models data parallel in the same
processes (ours on the job's backend, torch's DDP on gloo).
"""
from __future__ import annotations

import time
from typing import Any, Dict, List

import numpy as np

import resnet_twin

LR = 0.01
MODELS = ("conv", "resnet8")
PHASES = ("forward", "backward", "update")
MODEL_TITLES = {"conv": "Conv2d 3→16 3×3", "resnet8": "resnet8"}


def _conv_layer(nn):
    """One 3→16 3×3 convolution (padding 1); global average pooling turns its 16 channels
    into the logits of a 16-way cross-entropy. ``nn`` is ``neural_arch.nn`` or ``torch.nn``."""
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.AdaptiveAvgPool2d(1), nn.Flatten())


def classes(model: str) -> int:
    return 16 if model == "conv" else 10


def build_ours(model: str):
    from neural_arch import nn
    from neural_arch.core import manual_seed
    from neural_arch.models import resnet8
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; choose from {MODELS}")
    manual_seed(0)
    return _conv_layer(nn) if model == "conv" else resnet8()


def build_pair(torch, model: str):
    """(ours, theirs): the same network, torch's loaded with ours' initial state."""
    ours = build_ours(model)
    theirs = _conv_layer(torch.nn) if model == "conv" else resnet_twin.torch_resnet(torch)
    resnet_twin.load_our_state(torch, theirs, ours.state_dict(), model)
    return ours, theirs


def batch(model: str, size: int, image: int, seed: int):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((size, 3, image, image)).astype(np.float32)
    return x, rng.integers(0, classes(model), size).astype(np.int64)


class OursStep:
    def __init__(self, model, x, y) -> None:
        from neural_arch import functional as F
        from neural_arch.optim import SGD
        self.model, self.x, self.y, self.loss_fn = model, x, y, F.cross_entropy
        self.optimizer = SGD(model.parameters(), lr=LR)

    def __call__(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(self.x), self.y)
        t1 = time.perf_counter()
        loss.backward()  # under DDP this includes the gradient averaging it overlaps
        t2 = time.perf_counter()
        self.optimizer.step()
        t3 = time.perf_counter()
        self.loss = float(loss.array)
        return {"forward": t1 - t0, "backward": t2 - t1, "update": t3 - t2}


class TorchStep:
    def __init__(self, torch, model, x, y) -> None:
        self.model, self.x, self.y = model, torch.from_numpy(x), torch.from_numpy(y)
        self.loss_fn = torch.nn.functional.cross_entropy
        self.optimizer = torch.optim.SGD(model.parameters(), lr=LR)

    def __call__(self) -> Dict[str, float]:
        t0 = time.perf_counter()
        self.optimizer.zero_grad()
        loss = self.loss_fn(self.model(self.x), self.y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        self.optimizer.step()
        t3 = time.perf_counter()
        self.loss = loss.item()
        return {"forward": t1 - t0, "backward": t2 - t1, "update": t3 - t2}


def check_first_losses(steps: Dict[str, Any], model: str) -> None:
    """After one step each from the same weights and data the losses must agree."""
    ours, theirs = steps["neural_arch"].loss, steps["torch"].loss
    if not np.isclose(ours, theirs, rtol=1e-4):
        raise RuntimeError(f"{model}: first-step losses differ: neural_arch {ours}, torch "
                           f"{theirs}; the two are not the same computation")


def time_pair(steps: Dict[str, Any], n_steps: int, warmup: int, model: str,
              barrier=lambda: None) -> Dict[str, Dict[str, List[float]]]:
    """{name: {phase or "step": [seconds per timed step]}}, the names stepped in turn."""
    names = list(steps)
    times = {name: {key: [] for key in PHASES + ("step",)} for name in names}
    for i in range(warmup + n_steps):
        for name in (names if i % 2 == 0 else names[::-1]):
            barrier()
            phases = steps[name]()
            if i == 0 and name == names[-1] and len(names) > 1:
                check_first_losses(steps, model)
            if i >= warmup:
                for key, seconds in phases.items():
                    times[name][key].append(seconds)
                times[name]["step"].append(sum(phases.values()))
    return times


def medians_ms(times: Dict[str, Dict[str, List[float]]]) -> Dict[str, Dict[str, float]]:
    return {name: {key: float(np.median(v)) * 1e3 for key, v in per.items()}
            for name, per in times.items()}


def time_models(torch, models, batch_size: int, image: int, n_steps: int,
                warmup: int) -> Dict[str, Dict[str, Dict[str, float]]]:
    """p = 1: {model: {"neural_arch" / "torch": {phase or "step": median ms}}}."""
    results = {}
    for model in models:
        x, y = batch(model, batch_size, image, seed=1)
        if torch is None:
            steps = {"neural_arch": OursStep(build_ours(model), x, y)}
        else:
            ours, theirs = build_pair(torch, model)
            steps = {"neural_arch": OursStep(ours, x, y),
                     "torch": TorchStep(torch, theirs, x, y)}
        results[model] = medians_ms(time_pair(steps, n_steps, warmup, model))
    return results


def _torch_store(torch: Any, rank: int, world: int) -> Any:
    """torch's rendezvous store: rank 0 listens on a port the system picks (a port chosen
    beforehand could be taken by then) and tells the others through our own group."""
    from neural_arch import distributed as dist
    store = (torch.distributed.TCPStore("127.0.0.1", 0, world, is_master=True,
                                        wait_for_workers=False)
             if rank == 0 else None)
    port = [store.port if store is not None else None]
    dist.broadcast_object_list(port, src=0)
    if store is None:
        store = torch.distributed.TCPStore("127.0.0.1", port[0], world, is_master=False)
    return store


def ddp_worker(job: Dict[str, Any]) -> Dict[str, Any]:
    """One rank of the p = 2 job: resnet8 data parallel in both frameworks, ``batch`` images
    per rank, stepped in turn after a barrier; the slower rank's medians."""
    import torch
    from neural_arch import distributed as dist
    torch.set_num_threads(1)
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.distributed.init_process_group("gloo", store=_torch_store(torch, rank, world),
                                         rank=rank, world_size=world)
    try:
        ours, theirs = build_pair(torch, job["model"])
        x, y = batch(job["model"], job["batch"], job["image"], seed=1 + rank)
        steps = {"neural_arch": OursStep(dist.DistributedDataParallel(ours), x, y),
                 "torch": TorchStep(torch, torch.nn.parallel.DistributedDataParallel(theirs),
                                    x, y)}
        times = time_pair(steps, job["steps"], job["warmup"], job["model"], dist.barrier)
    finally:
        torch.distributed.destroy_process_group()
    mine = medians_ms(times)
    everyone = dist.all_gather_object(mine)
    return {name: {key: max(r[name][key] for r in everyone) for key in mine[name]}
            for name in mine}
