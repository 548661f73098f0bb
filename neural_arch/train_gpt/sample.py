"""``--sample N``: text from the newest checkpoint of a run, in one process. A --pp run's
checkpoint holds every rank's piece: ``load_dense_checkpoint`` rebuilds the dense GPT."""
from __future__ import annotations

import argparse
import json
import os

import numpy as np

from ..distributed.checkpoint import DistributedCheckpointManager
from ..distributed.parallel3d import load_dense_checkpoint
from ..models.gpt import GPT, GPTConfig
from .args import UsageError
from .pipeline_checkpoints import latest_checkpoint
from .run import RUN_FILE, TOKENIZER_FILE
from .text import Tokenizer


def sample(args: argparse.Namespace) -> str:
    out_dir = os.path.abspath(args.out_dir)
    run_path = os.path.join(out_dir, RUN_FILE)
    if not os.path.isfile(run_path):
        raise UsageError(f"--sample: {out_dir} holds no run ({RUN_FILE} is missing); train "
                         f"into it first")
    with open(run_path, encoding="utf-8") as handle:
        run = json.load(handle)
    pipeline = run.get("pp", 1) > 1
    if run["tp"] != 1 and not pipeline:
        raise UsageError(f"--sample reads data-parallel checkpoints; the run in {out_dir} "
                         f"was tensor parallel (--tp {run['tp']})")
    tokenizer = Tokenizer.load(os.path.join(out_dir, TOKENIZER_FILE))
    model = GPT(GPTConfig(**run["model"]))
    checkpoints = os.path.join(out_dir, "checkpoints")
    if pipeline:  # every piece, tensor-parallel shards included, joined into the dense GPT
        path = latest_checkpoint(checkpoints)
        if path is None:
            raise UsageError(f"--sample: no checkpoint in {checkpoints}")
        model.load_state_dict(load_dense_checkpoint(path)[1])
    else:
        manager = DistributedCheckpointManager(checkpoints)
        path = manager.latest()
        if path is None:
            raise UsageError(f"--sample: no checkpoint in {manager.checkpoint_dir}")
        manager.load_checkpoint(model, path=path, restore_rng=False)
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
