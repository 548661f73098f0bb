"""Training: join the job, build the tokenizer, data, GPT and optimizer, and hand them to
``neural_arch.training.Trainer`` (the same loop any model uses).

How the job is joined: ``--world-size``/``--rank`` given (one command per rank, as in the
multi-node recipe) → a ``tcp://MASTER_ADDR:MASTER_PORT`` rendezvous; started by the launcher,
mpirun or srun (their variables are set) → ``env://``; otherwise one process (``--world-size
N`` alone has already restarted the program under the launcher: ``self_launch``). ``--tp t``
arranges the world as a (dp, tp) mesh: the model is split over each "tp" group and gradients
are averaged over the "dp" group (the Trainer's "tensor_parallel" strategy). ``--pp p`` trains
a ``GPT3D`` on a (dp, tp, pp) mesh (``pipeline_run``) with the same Trainer and its "pipeline"
strategy.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
from typing import Any, Dict, Tuple

from ..core import manual_seed
from ..data import DataLoader
from ..distributed import (destroy_process_group, get_rank, get_world_size, init_device_mesh,
                           init_process_group, is_initialized)
from ..distributed.checkpoint import CheckpointError
from ..distributed.errors import DistributedError
from ..distributed.group.world import resolve_group
from ..models.gpt import GPT, GPTConfig
from ..optim import AdamW
from ..training import Callback, Trainer, TrainingConfig
from .announce import AnnounceResume, announce_backend
from .args import UsageError
from .out_dir_claim import claim_out_dir
from .saved_run import RUN_FILE, TOKENIZER_FILE, load_failure, read_run_file
from .self_launch import under_a_launcher
from .text import Tokenizer, read_text, split_windows



def join(args: argparse.Namespace) -> None:
    backend = args.backend
    if args.world_size is not None and (args.rank is not None or args.world_size == 1):
        init_process_group(backend, init_method=f"tcp://{args.master_addr}:{args.master_port}",
                           world_size=args.world_size, rank=args.rank or 0)
    elif under_a_launcher():
        init_process_group(backend, world_size=args.world_size)
    else:
        init_process_group(backend, world_size=1, rank=0)
    announce_backend(args)


def gpu_of(device: str) -> str:
    """``cuda:N`` as given, or for ``cuda`` the GPU of this rank's LOCAL_RANK (modulo the GPUs
    visible: ranks share GPUs when there are fewer, which the collectives allow)."""
    from ..backends import cupy_backend
    try:
        count = cupy_backend.require().cuda.runtime.getDeviceCount()
    except RuntimeError as exc:  # no CuPy, or no device: one line, exit 2
        raise UsageError(f"--device {device}: {exc}") from None
    if device != "cuda":
        if int(device[5:]) >= count:
            raise UsageError(f"--device {device}: {count} GPU(s) visible")
        return device
    return f"cuda:{int(os.environ.get('LOCAL_RANK', '0')) % count}"


def model_config(args: argparse.Namespace, tokenizer: Tokenizer) -> GPTConfig:
    vocab = args.vocab_size
    if vocab is None:
        # The tokenizer's, rounded up to a multiple of 8 and of --tp: --tp splits it evenly,
        # and runs with --tp 1, 2, 4 or 8 build the same model from the same text.
        multiple = 8 * args.tp // math.gcd(8, args.tp)
        vocab = -(-tokenizer.vocab_size // multiple) * multiple
    elif vocab < tokenizer.vocab_size:
        raise UsageError(f"--vocab-size {vocab} is smaller than the {args.tokenizer} "
                         f"tokenizer's {tokenizer.vocab_size} tokens of {args.data}")
    return GPTConfig(block_size=args.max_seq_length, vocab_size=vocab, n_layer=args.layers,
                     n_head=args.attention_heads, n_embd=args.hidden_size, dropout=args.dropout,
                     gradient_checkpointing=args.use_gradient_checkpointing)


def build_model(config: GPTConfig, tp: int, seed: int) -> Tuple[Any, Any]:
    """(model, data-parallel group or None for the whole world)."""
    manual_seed(seed)  # every rank starts from the same weights
    world = get_world_size()
    if tp == 1:
        return GPT(config), None
    if world % tp:
        raise UsageError(f"--tp {tp} does not divide the world size {world}")
    from ..distributed.tensor_parallel import parallelize_gpt  # tensor-parallel runs only
    mesh = init_device_mesh((world // tp, tp), mesh_dim_names=("dp", "tp"))
    # The dense model's weights, sharded: the same start as --tp 1 with the same seed.
    model = parallelize_gpt(GPT(config), mesh.get_group("tp"))
    return model, mesh.get_group("dp")


def _check_resumable(out_dir: str, config: GPTConfig, tp: int, pp: int) -> None:
    path = os.path.join(out_dir, RUN_FILE)
    if not os.path.isfile(path):
        return
    try:
        saved = read_run_file(path)
    except ValueError as exc:
        raise UsageError(f"--resume: {exc}; restore it, or train into a fresh --out-dir") \
            from None
    saved_pp = saved.get("pp", 1)  # runs from before --pp were data/tensor parallel only
    if saved["model"] != dataclasses.asdict(config) or saved["tp"] != tp or saved_pp != pp:
        raise UsageError(f"--resume: the flags describe a different model than the run in "
                         f"{out_dir} (saved {saved['model']}, tp {saved['tp']}, pp {saved_pp}; "
                         f"now tp {tp}, pp {pp})")


def _resume_failure(checkpoints: str, exc: BaseException) -> str:
    """A failed --resume load in one line: what failed and what to do."""
    if isinstance(exc, (KeyError, ValueError)):  # names or shapes differ from the flags' model
        return (f"--resume: the checkpoint in {checkpoints} does not fit the model the flags "
                f"describe ({load_failure(exc)}); give the flags it was trained with, or "
                f"train into a fresh --out-dir")
    return f"--resume from {checkpoints} failed: {load_failure(exc)}"


def save_run(out_dir: str, tokenizer: Tokenizer, config: GPTConfig,
             args: argparse.Namespace) -> None:
    """``tokenizer.json`` and ``run.json`` (what --resume and --sample read); rank 0 writes."""
    if get_rank() != 0:
        return
    os.makedirs(out_dir, exist_ok=True)
    tokenizer.save(os.path.join(out_dir, TOKENIZER_FILE))
    with open(os.path.join(out_dir, RUN_FILE), "w", encoding="utf-8") as handle:
        json.dump({"model": dataclasses.asdict(config), "tp": args.tp, "pp": args.pp,
                   "world_size": get_world_size(), "args": vars(args)}, handle, indent=1)


class _SaveRunAtStart(Callback):
    """``save_run`` once the Trainer has resumed: a checkpoint that does not load leaves the
    run files as they were."""

    def __init__(self, *save_args: Any) -> None:
        self.save_args, self.started = save_args, False

    def on_fit_start(self, trainer: Any) -> None:
        save_run(*self.save_args)
        self.started = True


def _check_job(args: argparse.Namespace) -> None:
    """What the flags and the job alone reveal: before --out-dir is claimed or data read."""
    world = get_world_size()
    if world % (args.tp * args.pp):
        raise UsageError(f"--tp {args.tp} x --pp {args.pp} does not divide the world size "
                         f"{world}")
    if args.device != "cpu":
        gpu_of(args.device)


def train(args: argparse.Namespace) -> Dict[str, Any]:
    join(args)
    try:
        _check_job(args)
        with claim_out_dir(args, os.path.abspath(args.out_dir)):
            return _train(args)
    finally:
        if is_initialized():
            destroy_process_group()


def _train(args: argparse.Namespace) -> Dict[str, Any]:
    out_dir = os.path.abspath(args.out_dir)
    try:
        text = read_text(args.data)
    except OSError as exc:
        raise UsageError(f"--data {args.data}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise UsageError(f"--data {args.data} {exc}") from None
    saved_tokenizer = os.path.join(out_dir, TOKENIZER_FILE)
    if args.resume and os.path.isfile(saved_tokenizer):
        try:
            tokenizer = Tokenizer.load(saved_tokenizer)
        except ValueError as exc:
            raise UsageError(f"--resume: {exc}") from None
    else:
        tokenizer = Tokenizer.from_text(args.tokenizer, text)
    try:
        train_set, val_set = split_windows(tokenizer.encode(text), args.max_seq_length,
                                           args.val_fraction)
    except ValueError as exc:
        raise UsageError(f"--data {args.data}: {exc}") from None
    config = model_config(args, tokenizer)
    if args.resume:
        _check_resumable(out_dir, config, args.tp, args.pp)
    if args.pp > 1:
        from .pipeline_run import build_pipeline_model, check_pipeline_data
        pipeline = build_pipeline_model(args, config)
        check_pipeline_data(args, pipeline, train_set)
        return _fit(args, config, tokenizer, train_set, val_set, pipeline, pipeline.optimizer,
                    os.path.join(out_dir, "checkpoints"), None, "pipeline")
    model, dp_group = build_model(config, args.tp, args.seed)
    if args.device != "cpu":  # the same weights as on the CPU, moved
        model.to(gpu_of(args.device))
    tp_rank = 0 if args.tp == 1 else get_rank() % args.tp
    # each tensor-parallel rank checkpoints its own shards, over its data-parallel group
    checkpoints = os.path.join(out_dir, "checkpoints")
    if args.tp > 1:
        checkpoints = os.path.join(checkpoints, f"tp{tp_rank}")
    optimizer = AdamW(model.parameters(), lr=args.learning_rate, weight_decay=args.weight_decay)
    return _fit(args, config, tokenizer, train_set, val_set, model, optimizer, checkpoints,
                dp_group, "tensor_parallel" if args.tp > 1 else None)


def _fit(args: argparse.Namespace, config: GPTConfig, tokenizer: Tokenizer, train_set: Any,
         val_set: Any, model: Any, optimizer: Any, checkpoints: str, dp_group: Any,
         strategy: Any) -> Dict[str, Any]:
    """The Trainer's run, whatever the parallelism (``strategy``: None chooses from
    --zero-stage)."""
    out_dir = os.path.abspath(args.out_dir)
    cfg = TrainingConfig(
        epochs=args.epochs, max_steps=args.max_steps,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        max_grad_norm=args.gradient_clip_norm or None, mixed_precision=args.mixed_precision,
        zero_stage=args.zero_stage, lr_schedule=args.lr_schedule,
        warmup_steps=args.warmup_steps, seed=args.seed, log_interval=args.log_interval,
        eval_interval=args.eval_interval, eval_batches=args.eval_batches,
        checkpoint_dir=checkpoints, save_interval=args.save_interval, resume=args.resume,
        metrics_dir=out_dir, tokens_per_sample=args.max_seq_length,
        # --tp (and --pp's last stage) find the predictions over the vocabulary split across
        # the tp group, without gathering the logits
        compute_accuracy=True, progress_bar=not args.no_progress)
    run_files = _SaveRunAtStart(out_dir, tokenizer, config, args)
    callbacks = [run_files] + ([AnnounceResume()] if args.resume else [])
    # every tensor-parallel rank resumes from the newest step intact in all their directories
    trainer = Trainer(model, optimizer, config=cfg, group=dp_group,
                      resume_group=resolve_group(None), callbacks=callbacks,
                      strategy=strategy)
    if args.pp > 1:
        from .pipeline_run import announce_pipeline
        announce_pipeline(args, model, config, len(train_set))
    elif get_rank() == 0:
        print(f"GPT: {model.num_parameters():,} parameters per tensor-parallel rank, vocab "
              f"{config.vocab_size} ({args.tokenizer}), {len(train_set)} training windows of "
              f"{args.max_seq_length} tokens; world {get_world_size()} = "
              f"{trainer.world} data-parallel x {args.tp} tensor-parallel", flush=True)
    try:
        history = trainer.fit(DataLoader(train_set, batch_size=args.batch_size, shuffle=True),
                              DataLoader(val_set, batch_size=args.batch_size)
                              if len(val_set) else None)
    except (CheckpointError, DistributedError, KeyError, ValueError) as exc:
        if not args.resume or run_files.started:
            raise
        raise UsageError(_resume_failure(checkpoints, exc)) from None
    return {"history": history.state_dict(), "steps": trainer.step}
