"""What ``--pp > 1`` adds to training: the ``GPT3D`` on a (dp, tp, pp) device mesh, built so
that it starts from the dense GPT's weights of ``--seed`` (the --pp 1 run's start), and the
line rank 0 prints about it. The loop is the ``Trainer``'s, with the "pipeline" strategy
(``neural_arch.training.strategies.pipeline``): the same records, validation, checkpoints and
resume as every other run, and, reading the data-parallel program's batches over the dp group,
the losses of the --pp 1 run.
"""
from __future__ import annotations

import argparse

from ..core import manual_seed
from ..distributed import get_rank, get_world_size, init_device_mesh
from ..distributed.parallel3d import GPT3D
from ..models.gpt import GPTConfig
from .args import INTERLEAVED_CHUNKS, UsageError
from .text import TokenWindows


def build_pipeline_model(args: argparse.Namespace, config: GPTConfig) -> GPT3D:
    world, tp, pp = get_world_size(), args.tp, args.pp
    if world % (tp * pp):
        raise UsageError(f"--tp {tp} x --pp {pp} does not divide the world size {world}")
    mesh = init_device_mesh((world // (tp * pp), tp, pp), mesh_dim_names=("dp", "tp", "pp"))
    manual_seed(args.seed)  # every rank cuts its piece from the dense weights of this seed
    return GPT3D(config, mesh, args.microbatches, schedule=args.pp_schedule,
                 chunks=INTERLEAVED_CHUNKS,
                 data_parallel="zero1" if args.zero_stage == 1 else "ddp",
                 max_grad_norm=args.gradient_clip_norm or None, lr=args.learning_rate,
                 weight_decay=args.weight_decay)


def check_pipeline_data(args: argparse.Namespace, model: GPT3D, train_set: TokenWindows) -> None:
    """UsageError when no replica gets a batch the micro-batches split (the strategy drops a
    short last batch they do not split)."""
    share = -(-len(train_set) // model.dp)  # the sampler pads every replica to this
    full, rest = divmod(share, args.batch_size)
    if not full and (not rest or rest % args.microbatches):
        raise UsageError(f"--data {args.data}: {len(train_set)} training windows make no batch "
                         f"of --batch-size {args.batch_size} for each of {model.dp} "
                         f"data-parallel ranks")


def announce_pipeline(args: argparse.Namespace, model: GPT3D, config: GPTConfig,
                      windows: int) -> None:
    if get_rank() != 0:
        return
    held = sum(int(p.array.size) for p in model.params)
    print(f"GPT: {held:,} parameters on rank 0 (pipeline stage 0, tensor-parallel shard 0), "
          f"vocab {config.vocab_size} ({args.tokenizer}), {windows} training windows of "
          f"{args.max_seq_length} tokens; world {get_world_size()} = {model.dp} data-parallel x "
          f"{model.tp} tensor-parallel x {model.pp} pipeline stages ({args.pp_schedule}, "
          f"{args.microbatches} micro-batches)", flush=True)


__all__ = ["announce_pipeline", "build_pipeline_model", "check_pipeline_data"]
