"""Data-parallel training of an MLP on the digits data set, one process per rank.

Run it with the launcher (two processes on the shared-memory backend):

    python -m neural_arch.distributed.launcher examples/train_distributed.py --nproc_per_node=2 --backend=shm

Every rank builds the same model (DistributedDataParallel copies rank 0's weights to all),
reads its own share of each epoch through DistributedSampler, and averages gradients before
each optimizer step: by default during ``loss.backward()`` (as in PyTorch), or with
``--explicit-sync`` in a ``sync_gradients()`` call after it. Loss and accuracy are averaged
across ranks once per epoch.

Rank 0 shows one progress bar for the whole run when the output ends on a terminal, and plain
lines otherwise (a log file gets no carriage returns or redrawn bars).
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from tqdm import tqdm

import neural_arch.functional as F
from neural_arch.core import manual_seed, no_grad
from neural_arch.data import DataLoader, load_digits
from neural_arch.distributed import (DistributedDataParallel, DistributedSampler, ReduceOp,
                                     all_reduce, destroy_process_group, get_distributed_info,
                                     get_rank, get_world_size, init_process_group)
from neural_arch.models import MLP
from neural_arch.optim import SGD


def console_is_terminal() -> bool:
    """Whether this process's output ends on a terminal. Under the launcher stdout is a pipe
    (the launcher prefixes each line with the rank), so it is the launcher's stdout that counts:
    it is this process's parent."""
    if sys.stdout.isatty():
        return True
    if "LOCAL_RANK" not in os.environ:  # not started by the launcher
        return False
    try:
        target = os.readlink(f"/proc/{os.getppid()}/fd/1")
    except OSError:  # no /proc (not Linux) or not permitted: plain lines are always safe
        return False
    return target.startswith(("/dev/pts/", "/dev/tty"))


def evaluate(model, dataset) -> float:
    x, y = dataset.tensors
    with no_grad():
        predictions = model(x).array.argmax(axis=1)
    return float((predictions == y.array).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=15)
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default=None, help="default: the launcher's choice")
    parser.add_argument("--explicit-sync", action="store_true",
                        help="average gradients in sync_gradients() after backward instead of "
                             "during backward")
    args = parser.parse_args()

    init_process_group(backend=args.backend or "auto")
    rank, world = get_rank(), get_world_size()
    manual_seed(args.seed + rank)  # replicas start different; DDP makes them equal

    train, test = load_digits(seed=args.seed)
    model = DistributedDataParallel(MLP([64, args.hidden, 10]), auto_sync=not args.explicit_sync)
    optimizer = SGD(model.parameters(), lr=args.lr, momentum=0.9)
    sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler, drop_last=False)

    # One bar for the whole run: epochs take a fraction of a second, so a bar per epoch would
    # sit at 0% and be replaced before it moved.
    bar = None
    if rank == 0 and console_is_terminal():
        bar = tqdm(total=args.epochs * len(loader), desc="training", unit="batch",
                   file=sys.stdout, dynamic_ncols=True)
    start = time.perf_counter()
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        totals = np.zeros(3, dtype=np.float64)  # loss sum, correct, samples
        for x, y in loader:
            logits = model(x)
            loss = F.cross_entropy(logits, y)
            optimizer.zero_grad()
            loss.backward()  # gradients are averaged over the ranks when it returns
            if args.explicit_sync:
                model.sync_gradients()
            optimizer.step()
            n = len(y.array)
            totals += (loss.item() * n, float((logits.array.argmax(axis=1) == y.array).sum()), n)
            if bar is not None:
                bar.update()
        all_reduce(totals, ReduceOp.SUM)
        if rank == 0:
            line = (f"epoch {epoch + 1:2d}  loss {totals[0] / totals[2]:.4f}  "
                    f"train_acc {totals[1] / totals[2]:.4f}  (over {world} ranks, "
                    f"{int(totals[2])} samples)")
            if bar is None:
                print(line, flush=True)
            else:
                bar.write(line)  # above the bar, which stays at the bottom
    if bar is not None:
        bar.close()

    accuracy = evaluate(model.module, test)
    # Replicas must have stayed identical: the spread of accuracies across ranks is zero.
    spread = np.array([accuracy, -accuracy])
    all_reduce(spread, ReduceOp.MAX)
    if rank == 0:
        print(f"final: test_accuracy={accuracy:.4f} world_size={world} "
              f"backend={get_distributed_info()['backend']} replicas_agree={spread[0] == -spread[1]} "
              f"seconds={time.perf_counter() - start:.1f}", flush=True)
    destroy_process_group()


if __name__ == "__main__":
    main()
