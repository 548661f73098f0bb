"""A small, fully deterministic data-parallel training job for the checkpoint tests (no tests
here).

Imported, ``TrainingJob`` gives one rank's model, optimizer, scheduler and sampler and runs
numbered steps; each step draws dropout masks from the framework's global generator and input
noise from NumPy's legacy global generator, so a resumed run only matches an uninterrupted one
when every piece of state, both generators included, was restored.

Run as a script (under the launcher) it trains ``--steps`` steps with checkpoints every
``--save_every`` steps, stops cleanly at a step boundary when preempted, and can pause for a
signal or kill itself at a chosen step on the first attempt. Records land in ``--out``.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Optional

import numpy as np

import neural_arch as na
from neural_arch import functional as F
from neural_arch import nn, optim

DATA_SIZE, FEATURES, CLASSES, BATCH = 40, 6, 3, 4


def make_data() -> tuple:
    rng = np.random.default_rng(1234)
    inputs = rng.standard_normal((DATA_SIZE, FEATURES)).astype(np.float32)
    labels = rng.integers(0, CLASSES, DATA_SIZE).astype(np.int64)
    return inputs, labels


class TrainingJob:
    """One rank's share of the job. ``model`` is the DDP wrapper when ``distributed``."""

    def __init__(self, optimizer: str = "sgd", rank: int = 0, world_size: int = 1,
                 distributed: bool = False, init_seed: int = 0) -> None:
        from neural_arch.distributed import DistributedSampler
        na.manual_seed(init_seed)  # the same weights on every rank
        self.net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Dropout(0.25),
                                 nn.Linear(16, CLASSES))
        na.manual_seed(100 + rank)  # then each rank its own dropout stream
        np.random.seed(200 + rank)
        if distributed:
            from neural_arch.distributed import DistributedDataParallel
            self.model = DistributedDataParallel(self.net)
        else:
            self.model = self.net
        params = list(self.net.parameters())
        if optimizer == "sgd":
            self.optimizer = optim.SGD(params, lr=0.05, momentum=0.9, nesterov=True,
                                       weight_decay=1e-3)
        elif optimizer == "adam":
            self.optimizer = optim.Adam(params, lr=0.01, weight_decay=1e-3, amsgrad=True)
        else:
            raise ValueError(f"unknown optimizer {optimizer!r}")
        warmup = optim.LinearLR(self.optimizer, start_factor=0.5, total_iters=3)
        cosine = optim.CosineAnnealingLR(self.optimizer, T_max=10, eta_min=1e-3)
        self.scheduler = optim.SequentialLR(self.optimizer, [warmup, cosine], milestones=[3])
        self.sampler = DistributedSampler(DATA_SIZE, num_replicas=world_size, rank=rank,
                                          shuffle=True, seed=7)
        self.steps_per_epoch = len(self.sampler) // BATCH
        self.distributed = distributed
        self.inputs, self.labels = make_data()

    def epoch_of(self, step: int) -> int:
        return step // self.steps_per_epoch

    def step(self, step: int) -> float:
        """Train global step ``step``; returns the local loss."""
        epoch, index = divmod(step, self.steps_per_epoch)
        if self.sampler.epoch != epoch:
            self.sampler.set_epoch(epoch)
        batch = self.sampler.indices()[index * BATCH:(index + 1) * BATCH]
        noise = 0.01 * np.random.standard_normal((len(batch), FEATURES)).astype(np.float32)
        logits = self.model(na.Tensor(self.inputs[batch] + noise))
        loss = F.cross_entropy(logits, self.labels[batch])
        self.optimizer.zero_grad()
        loss.backward()
        if self.distributed:
            self.model.sync_gradients()
        self.optimizer.step()
        self.scheduler.step()
        return float(loss.array)

    def parameters(self) -> dict:
        return {name: p.array.copy() for name, p in self.net.named_parameters()}


# ----- script mode -------------------------------------------------------------------------------
def _record(out: Path, name: str, payload: Any) -> None:
    path = out / name
    path.with_suffix(".tmp").write_text(json.dumps(payload))
    path.with_suffix(".tmp").rename(path)


def _record_pid(out: Path, rank: int, attempt: int) -> None:
    """``pid starttime`` in the launcher tests' format, so their cleanup can find strays."""
    pid = os.getpid()
    start = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    path = out / f"pid_worker_{rank}_{attempt}_{pid}"
    path.with_suffix(".tmp").write_text(f"{pid} {start}")
    path.with_suffix(".tmp").rename(path)


def _wait_for_signal(preemption: Any, limit: float) -> None:
    deadline = time.monotonic() + limit
    while not preemption.requested:
        if time.monotonic() > deadline:
            sys.exit(3)  # nobody sent the signal: fail loudly rather than hang
        time.sleep(0.01)


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--save_every", type=int, default=3)
    parser.add_argument("--optimizer", default="sgd")
    parser.add_argument("--pause_at", type=int, default=-1)
    parser.add_argument("--pause_rank", type=int, default=0)
    parser.add_argument("--die_at", type=int, default=-1)
    parser.add_argument("--die_rank", type=int, default=1)
    parser.add_argument("--die_how", choices=["exit", "kill"], default="exit")
    args = parser.parse_args(argv)

    from neural_arch import distributed as dist
    from neural_arch.distributed.checkpoint import (DistributedCheckpointManager,
                                                    setup_fault_tolerant_training)
    from neural_arch.distributed.health.preemption import PreemptionHandler
    from neural_arch.nn.serialization import save_state_dict

    out = Path(args.out)
    attempt = int(os.environ.get("RESTART_COUNT", "0"))
    _record_pid(out, int(os.environ.get("RANK", "0")), attempt)
    with PreemptionHandler() as preemption:
        dist.init_process_group(backend=os.environ.get("NEURAL_ARCH_BACKEND", "auto"),
                                timeout=60)
        rank, world_size = dist.get_rank(), dist.get_world_size()
        job = TrainingJob(args.optimizer, rank, world_size, distributed=True)
        manager = DistributedCheckpointManager(out / "checkpoints", max_checkpoints=3)
        state = setup_fault_tolerant_training(job.model, job.optimizer, manager,
                                              scheduler=job.scheduler, sampler=job.sampler)
        _record(out, f"start_rank{rank}_pid{os.getpid()}.json",
                {"start_step": state["start_step"], "resumed": state["resumed"],
                 "attempt": attempt})
        stopped_at = None
        for step in range(state["start_step"], args.steps):
            loss = job.step(step)
            first_run = attempt == 0 and not state["resumed"]
            if first_run and step == args.die_at and rank == args.die_rank:
                if args.die_how == "kill":
                    os.kill(os.getpid(), 9)
                os._exit(17)
            if first_run and step == args.pause_at and rank == args.pause_rank:
                _record(out, f"paused_rank{rank}.json", {"pid": os.getpid(), "step": step})
                _wait_for_signal(preemption, 60.0)
            stop = preemption.should_stop()
            if stop or (step + 1) % args.save_every == 0:
                manager.save_checkpoint(job.model, job.optimizer, job.epoch_of(step), step, loss,
                                        additional_state={"attempt": attempt},
                                        scheduler=job.scheduler, sampler=job.sampler)
            if stop:
                stopped_at = step
                break
        if stopped_at is not None:
            received = preemption.received_signal
            _record(out, f"stopped_rank{rank}.json",
                    {"step": stopped_at, "signal": received.name if received else None})
        elif rank == 0:
            save_state_dict(job.net, out / "final.safetensors")
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
