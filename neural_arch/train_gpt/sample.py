"""``--sample N``: text from the newest checkpoint of a run, in one process. A --pp run's
checkpoint holds every rank's piece: ``load_dense_checkpoint`` rebuilds the dense GPT."""
from __future__ import annotations

import argparse
import os

import numpy as np

from ..distributed.checkpoint import CheckpointError, DistributedCheckpointManager
from ..distributed.parallel3d import load_dense_checkpoint
from ..models.gpt import GPT, GPTConfig
from .args import UsageError
from .saved_run import (CHECKPOINTS, RUN_FILE, TOKENIZER_FILE, load_failure,
                        newest_good_checkpoint, read_run_file)
from .text import Tokenizer


def sample(args: argparse.Namespace) -> str:
    out_dir = os.path.abspath(args.out_dir)
    run_path = os.path.join(out_dir, RUN_FILE)
    if not os.path.isfile(run_path):
        raise UsageError(f"--sample: {out_dir} holds no run ({RUN_FILE} is missing); train "
                         f"into it first")
    try:
        run = read_run_file(run_path)
        tokenizer = Tokenizer.load(os.path.join(out_dir, TOKENIZER_FILE))
    except ValueError as exc:
        raise UsageError(f"--sample: {exc}; restore it from the run that wrote it") from None
    pipeline = run.get("pp", 1) > 1
    if run["tp"] != 1 and not pipeline:
        raise UsageError(f"--sample reads data-parallel checkpoints; the run in {out_dir} "
                         f"was tensor parallel (--tp {run['tp']})")
    model = GPT(GPTConfig(**run["model"]))
    checkpoints = os.path.join(out_dir, CHECKPOINTS)
    try:
        path = newest_good_checkpoint(checkpoints)
    except ValueError as exc:
        raise UsageError(f"--sample: {exc}") from None
    if path is None:
        raise UsageError(f"--sample: no checkpoint in {checkpoints}")
    try:
        if pipeline:  # every piece, tensor-parallel shards included, joined into the dense GPT
            model.load_state_dict(load_dense_checkpoint(path)[1])
        else:
            DistributedCheckpointManager(checkpoints).load_checkpoint(model, path=path,
                                                                      restore_rng=False)
    except (KeyError, ValueError) as exc:  # names or shapes differ from run.json's model
        raise UsageError(f"--sample: the checkpoint {path} does not fit the model in "
                         f"{run_path} ({load_failure(exc)})") from None
    except CheckpointError as exc:  # replaced or damaged since it was checked
        raise UsageError(f"--sample: {load_failure(exc)}") from None
    prompt = args.prompt
    if prompt is None:  # a line break when the vocabulary has one: text starts on a new line
        prompt = "\n" if tokenizer.kind == "byte" or "\n" in tokenizer.chars \
            else tokenizer.chars[0]
    try:
        context = tokenizer.encode(prompt)[None, :]
    except ValueError as exc:
        raise UsageError(f"--prompt: {exc}") from None
    tokens = model.generate(context, args.sample, temperature=args.temperature,
                            top_k=args.top_k, rng=np.random.default_rng(args.seed))
    return tokenizer.decode(tokens[0].tolist())
