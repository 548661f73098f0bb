"""A Horovod training script, ported by its import line: ``import horovod.torch as hvd``
became ``import neural_arch.horovod as hvd``; the rest is Horovod's usual pattern.

    python -m neural_arch.horovod.run -np 2 python examples/train_horovod.py

A small MLP learns a random linear labelling of random inputs. Every rank seeds its model
differently on purpose: ``broadcast_parameters`` and ``broadcast_optimizer_state`` make them
start equal, ``DistributedOptimizer`` keeps them equal. ``--uneven`` gives rank r
``batches - r`` batches and finishes with ``hvd.join()``, then copies the last rank's weights
to all (the last rank to join trained longest). ``--out DIR`` writes each rank's final
parameters to ``DIR/rank<R>.npz``.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

import neural_arch.functional as F
import neural_arch.horovod as hvd
from neural_arch.core import Tensor, manual_seed
from neural_arch.models import MLP
from neural_arch.optim import SGD

IN, HIDDEN, CLASSES, BATCH = 8, 16, 3, 4


def data(seed: int, batches: int, rank: int, size: int):
    """This rank's shard of a data set made the same way on every rank."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batches * size * BATCH, IN))
    y = np.argmax(x @ rng.standard_normal((IN, CLASSES)), axis=1)
    return x[rank::size], y[rank::size]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batches", type=int, default=6, help="batches per rank and epoch")
    parser.add_argument("--backward-passes", type=int, default=1)
    parser.add_argument("--fp16", action="store_true", help="compress gradients to float16")
    parser.add_argument("--uneven", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    hvd.init()
    manual_seed(100 + hvd.rank())  # different on purpose: the broadcast below fixes it
    model = MLP([IN, HIDDEN, CLASSES], activation="tanh")
    optimizer = SGD(model.parameters(), lr=0.05 * hvd.size(), momentum=0.9)

    hvd.broadcast_parameters(dict(model.named_parameters()), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    compression = hvd.Compression.fp16 if args.fp16 else hvd.Compression.none
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                         compression=compression,
                                         backward_passes_per_step=args.backward_passes)

    x, y = data(7, args.batches, hvd.rank(), hvd.size())
    mine = args.batches - (hvd.rank() if args.uneven else 0)
    k = args.backward_passes
    for epoch in range(args.epochs):
        total = 0.0
        for i in range(mine):
            xb, yb = x[i * BATCH:(i + 1) * BATCH], y[i * BATCH:(i + 1) * BATCH]
            for xm, ym in zip(np.array_split(xb, k), np.array_split(yb, k)):
                loss = F.cross_entropy(model(Tensor(xm)), Tensor(ym))
                loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            total += float(loss.array)
        if args.uneven:
            break  # one epoch: join() below ends it
        mean = hvd.allreduce(np.array([total / max(mine, 1)]), name="loss")
        if hvd.rank() == 0:
            print(f"epoch {epoch}: loss {float(mean[0]):.4f}", flush=True)
    if args.uneven:
        last = hvd.join()
        hvd.broadcast_parameters(dict(model.named_parameters()), root_rank=last)
        if hvd.rank() == 0:
            print(f"last rank to join: {last}", flush=True)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        np.savez(os.path.join(args.out, f"rank{hvd.rank()}.npz"),
                 **{name: p.array for name, p in model.named_parameters()})
    hvd.shutdown()


if __name__ == "__main__":
    main()
