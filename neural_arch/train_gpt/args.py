"""The command line of ``python -m neural_arch.train_gpt`` and its checks.

Flag names follow the distributed-training documents this project started from
(``--hidden-size``, ``--world-size``, ...). Their defaults there describe GPU-sized models; here
they are sized for a NumPy model that trains in minutes on a CPU. Every mistake the flags alone
reveal is reported as one line on stderr with exit code 2, as argparse does, before any process
group is joined."""
from __future__ import annotations

import argparse
import math
import os
import sys
from typing import List, NoReturn, Optional

PROG = "python -m neural_arch.train_gpt"
PP_SCHEDULES = ("1f1b", "gpipe", "interleaved")
INTERLEAVED_CHUNKS = 2  # model chunks per pipeline rank under --pp-schedule interleaved


class UsageError(Exception):
    """A bad flag or combination of flags: reported as one line, exit code 2."""


def fail(message: str) -> NoReturn:
    message = "; ".join(line.strip() for line in message.splitlines() if line.strip())
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    sys.exit(2)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # one line, no usage block
        fail(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Train a GPT on a text file, in one process or many "
                "(launcher, mpirun, or one command per rank).")
    g = p.add_argument_group("data")
    g.add_argument("--data", help="a UTF-8 text file to train on")
    g.add_argument("--tokenizer", choices=("char", "byte"), default="char")
    g.add_argument("--val-fraction", type=float, default=0.1, help="end of the text held out")
    g = p.add_argument_group("model")
    g.add_argument("--vocab-size", type=int, default=None,
                   help="default: the tokenizer's, rounded up to a multiple of 8 and of --tp")
    g.add_argument("--hidden-size", type=int, default=128)
    g.add_argument("--attention-heads", type=int, default=4)
    g.add_argument("--layers", type=int, default=4)
    g.add_argument("--max-seq-length", type=int, default=64)
    g.add_argument("--dropout", type=float, default=0.0)
    g.add_argument("--use-gradient-checkpointing", action="store_true")
    g = p.add_argument_group("training")
    g.add_argument("--learning-rate", type=float, default=1e-3)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--batch-size", type=int, default=32, help="per data-parallel rank")
    g.add_argument("--gradient-accumulation-steps", type=int, default=1)
    g.add_argument("--epochs", type=int, default=1)
    g.add_argument("--max-steps", type=int, default=None, help="stop after this many steps")
    g.add_argument("--gradient-clip-norm", type=float, default=None,
                   help="clip by the whole model's gradient norm (default 1.0); 0 turns "
                   "clipping off")
    g.add_argument("--lr-schedule", choices=("constant", "cosine", "linear"), default="constant")
    g.add_argument("--warmup-steps", type=int, default=0)
    g.add_argument("--mixed-precision", action="store_true", help="float16 compute")
    g.add_argument("--device", default="cpu",
                   help="cpu, or cuda (each rank on GPU LOCAL_RANK modulo the GPUs visible; "
                   "needs CuPy) or cuda:N")
    g.add_argument("--zero-stage", type=int, choices=(0, 1, 2, 3), default=0)
    g.add_argument("--seed", type=int, default=1337)
    g = p.add_argument_group("output")
    g.add_argument("--out-dir", default="runs/gpt")
    g.add_argument("--save-interval", type=int, default=1000, help="steps between checkpoints")
    g.add_argument("--eval-interval", type=int, default=None, help="steps between validations")
    g.add_argument("--eval-batches", type=int, default=20, help="batches per validation")
    g.add_argument("--log-interval", type=int, default=10)
    g.add_argument("--resume", action="store_true", help="continue from the latest checkpoint")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    g.add_argument("--sample", type=int, default=None, metavar="N",
                   help="print N generated characters from the latest checkpoint; no training")
    g.add_argument("--prompt", default=None, help="text the sample continues")
    g.add_argument("--temperature", type=float, default=1.0)
    g.add_argument("--top-k", type=int, default=None)
    g = p.add_argument_group("distributed")
    g.add_argument("--world-size", type=int, default=None,
                   help="with --rank: one command per rank (default: the launcher's or 1)")
    g.add_argument("--rank", type=int, default=None)
    g.add_argument("--master-addr", default="localhost")
    g.add_argument("--master-port", type=int, default=29500)
    g.add_argument("--backend", default="auto", help="auto, shm, tcp, mpi, gloo or nccl")
    g.add_argument("--no-nccl", action="store_true", help="never use the nccl backend")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    g.add_argument("--pp", type=int, default=1, help="pipeline stages")
    g.add_argument("--microbatches", type=int, default=None,
                   help="micro-batches per pipeline step (default: --pp); must divide "
                        "--batch-size")
    g.add_argument("--pp-schedule", choices=PP_SCHEDULES, default=None,
                   help="pipeline schedule (default 1f1b)")
    return p


def _positive(args: argparse.Namespace, names: List[str]) -> None:
    for name in names:
        value = getattr(args, name.replace("-", "_"))
        if value is not None and value < 1:
            raise UsageError(f"--{name} must be a positive integer, got {value}")


def _check_pipeline(args: argparse.Namespace) -> None:
    """What ``GPT3D`` (the model of a --pp run) cannot do, and the shapes it needs."""
    pp, schedule = args.pp, args.pp_schedule or "1f1b"
    if args.zero_stage > 1:
        raise UsageError(f"--zero-stage {args.zero_stage} is not supported together with --pp "
                         f"{pp} (only 0 or 1: the pipeline shards the optimizer, not the "
                         f"parameters)")
    if args.mixed_precision:
        raise UsageError(f"--mixed-precision is not supported together with --pp {pp}")
    if args.gradient_accumulation_steps > 1:
        raise UsageError(f"--gradient-accumulation-steps {args.gradient_accumulation_steps} is "
                         f"not supported together with --pp {pp}; --microbatches already "
                         f"splits each step's batch")
    chunks = INTERLEAVED_CHUNKS if schedule == "interleaved" else 1
    if args.layers < pp * chunks:
        per = f" x {chunks} chunks per rank ({schedule})" if chunks > 1 else ""
        raise UsageError(f"--layers {args.layers} is fewer than the {pp * chunks} pipeline "
                         f"stages of --pp {pp}{per}: every stage needs a block")
    micro = args.microbatches or pp
    if args.batch_size % micro:
        raise UsageError(f"--microbatches {micro} does not divide --batch-size "
                         f"{args.batch_size}" + ("" if args.microbatches else
                                                 f" (the default is --pp {pp})"))


def check(args: argparse.Namespace) -> None:
    """Everything the flags alone can reveal; raises UsageError."""
    _positive(args, ["hidden-size", "attention-heads", "layers", "max-seq-length", "batch-size",
                     "epochs", "max-steps", "save-interval", "eval-interval", "eval-batches",
                     "log-interval", "gradient-accumulation-steps", "tp", "pp", "vocab-size",
                     "world-size", "sample", "microbatches", "top-k"])
    _check_numbers(args)
    if args.hidden_size % args.attention_heads:
        raise UsageError(f"--hidden-size {args.hidden_size} is not divisible by "
                         f"--attention-heads {args.attention_heads}")
    if args.sample is None:
        if args.data is None:
            raise UsageError("--data PATH is required (a text file to train on)")
        if not os.path.isfile(args.data):
            raise UsageError(f"--data {args.data}: no such file")
        _check_out_dir(args.out_dir)
    if args.pp > 1:
        _check_pipeline(args)
    elif args.microbatches is not None or args.pp_schedule is not None:
        flag = "--microbatches" if args.microbatches is not None else "--pp-schedule"
        raise UsageError(f"{flag} applies to pipeline parallelism only; it needs --pp > 1")
    if args.attention_heads % args.tp:
        raise UsageError(f"--tp {args.tp} does not divide --attention-heads "
                         f"{args.attention_heads}")
    if args.vocab_size is not None and args.vocab_size % args.tp:
        raise UsageError(f"--tp {args.tp} does not divide --vocab-size {args.vocab_size}")
    if args.tp > 1 and args.zero_stage and args.pp == 1:
        raise UsageError(f"--zero-stage {args.zero_stage} is not supported together with "
                         f"--tp {args.tp}")
    if args.backend == "nccl" and args.no_nccl:
        raise UsageError("--backend nccl contradicts --no-nccl")
    if args.rank is not None and args.world_size is None:
        raise UsageError("--rank needs --world-size")
    if args.world_size is not None and args.rank is not None \
            and not 0 <= args.rank < args.world_size:
        raise UsageError(f"--rank {args.rank} is outside [0, {args.world_size - 1}] for "
                         f"--world-size {args.world_size}")
    if args.world_size is not None and args.world_size % (args.tp * args.pp):
        raise UsageError(f"--tp {args.tp} x --pp {args.pp} does not divide --world-size "
                         f"{args.world_size}")
    _check_device(args)


def _check_numbers(args: argparse.Namespace) -> None:
    """Numbers argparse accepts that mean nothing here ("nan" and "inf" parse as floats)."""
    rules = [("learning-rate", lambda v: v > 0, "a finite number > 0"),
             ("weight-decay", lambda v: v >= 0, "a finite number >= 0"),
             ("gradient-clip-norm", lambda v: v >= 0, "a finite number >= 0 (0: no clipping)"),
             ("dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
             ("val-fraction", lambda v: 0 <= v < 1, "in [0, 1)"),
             ("temperature", lambda v: v > 0, "a finite number > 0")]
    for name, allowed, rule in rules:
        value = getattr(args, name.replace("-", "_"))
        if value is not None and not (math.isfinite(value) and allowed(value)):
            raise UsageError(f"--{name} must be {rule}, got {value}")
    if args.warmup_steps < 0:
        raise UsageError(f"--warmup-steps must be >= 0, got {args.warmup_steps}")


def _check_out_dir(out_dir: str) -> None:
    """A training run writes into --out-dir: it must be a folder, or one that can be made."""
    if os.path.exists(out_dir):
        if not os.path.isdir(out_dir):
            raise UsageError(f"--out-dir {out_dir} is not a directory (a file is there); name "
                             f"a directory, new or holding a run")
        if not os.access(out_dir, os.W_OK | os.X_OK):
            raise UsageError(f"--out-dir {out_dir}: no permission to write in it")
        return
    ancestor = os.path.dirname(os.path.abspath(out_dir))
    while not os.path.lexists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UsageError(f"--out-dir {out_dir} cannot be created: {ancestor} is not a "
                         f"directory")
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise UsageError(f"--out-dir {out_dir} cannot be created: no permission to write in "
                         f"{ancestor}")


def _check_device(args: argparse.Namespace) -> None:
    device = args.device
    if device != "cpu" and not (device == "cuda" or (device.startswith("cuda:")
                                                     and device[5:].isdigit())):
        raise UsageError(f"--device must be cpu, cuda or cuda:N, got {device!r}")
    if device == "cpu":
        return
    # what has run on a GPU: data and tensor parallelism, ZeRO 0 or 1, float32
    if args.pp > 1:
        raise UsageError(f"--pp {args.pp} is not supported together with --device {device} "
                         f"(the pipeline's messages are NumPy arrays)")
    if args.zero_stage > 1:
        raise UsageError(f"--zero-stage {args.zero_stage} is not supported together with "
                         f"--device {device} (FSDP shards NumPy parameters only)")
    if args.mixed_precision:
        raise UsageError(f"--mixed-precision is not supported together with --device {device}")


def parse(argv: Optional[List[str]] = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    try:
        check(args)
    except UsageError as exc:
        fail(str(exc))
    if args.gradient_clip_norm is None:
        args.gradient_clip_norm = 1.0
    if args.pp > 1:
        args.microbatches = args.microbatches or args.pp
        args.pp_schedule = args.pp_schedule or "1f1b"
    return args
