"""What a run leaves in ``--out-dir`` for ``--resume`` and ``--sample`` to read: ``run.json``
(the model and the mesh), ``tokenizer.json`` (``text.Tokenizer``) and the checkpoints, each
read with its damage named, so that a damaged file is refused in one line rather than loaded
into a wrong model or ending in a traceback."""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any, Dict, Optional

from ..distributed.checkpoint import format as fmt
from ..distributed.checkpoint.directory import CheckpointDirectory
from ..models.gpt import GPTConfig

RUN_FILE, TOKENIZER_FILE, CHECKPOINTS = "run.json", "tokenizer.json", "checkpoints"
_POSITIVE_FIELDS = ("block_size", "vocab_size", "n_layer", "n_head", "n_embd")


def read_run_file(path: str) -> Dict[str, Any]:
    """``run.json`` as saved by ``run.save_run``; ValueError naming ``path`` and its damage."""
    try:
        with open(path, encoding="utf-8") as handle:
            run = json.load(handle)
    except FileNotFoundError:
        raise ValueError(f"{path} is missing") from None
    except (OSError, ValueError) as exc:  # UnicodeDecodeError and JSONDecodeError too
        raise ValueError(f"{path} is damaged ({exc})") from None
    problem = _run_problem(run)
    if problem:
        raise ValueError(f"{path} is damaged ({problem})")
    return run


def _run_problem(run: Any) -> Optional[str]:
    if not isinstance(run, dict) or not isinstance(run.get("model"), dict):
        return "not a run's record: it needs a \"model\" object"
    model, names = run["model"], {field.name for field in dataclasses.fields(GPTConfig)}
    unknown = sorted(set(model) - names)
    if unknown:
        return f"\"model\" has fields a GPTConfig lacks: {unknown}"
    for name in _POSITIVE_FIELDS:
        if name in model and not _positive_int(model[name]):
            return f"\"model\".{name} must be a positive integer, got {model[name]!r}"
    config = GPTConfig(**model)
    if config.n_embd % config.n_head:
        return f"\"model\".n_embd {config.n_embd} is not divisible by n_head {config.n_head}"
    if not isinstance(config.dropout, (int, float)) or not 0 <= config.dropout < 1:
        return f"\"model\".dropout must be in [0, 1), got {config.dropout!r}"
    for name in ("tp", "pp"):
        if name in run and not _positive_int(run[name]):
            return f"\"{name}\" must be a positive integer, got {run[name]!r}"
    if "tp" not in run:
        return "\"tp\" is missing"
    return None


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def checkpoint_directory(out_dir: str, tp: int, pp: int, tp_rank: int = 0) -> str:
    """Where a run's checkpoints are: each tensor-parallel rank of a data/tensor parallel run
    has its own folder (``run._train``); a --pp run keeps every piece in one (``pipeline_run``)."""
    base = os.path.join(out_dir, CHECKPOINTS)
    return os.path.join(base, f"tp{tp_rank}") if tp > 1 and pp == 1 else base


def newest_good_checkpoint(directory: str) -> Optional[str]:
    """The newest checkpoint in ``directory`` whose files all match its manifest; None when
    there is no checkpoint at all; ValueError naming each one's damage when none is good.
    (Read here, not through ``CheckpointDirectory.latest_good``, which logs a warning for each
    damaged one: the refusal is the one line said.)"""
    found = CheckpointDirectory(directory).list()
    if not found:
        return None
    problems = []
    for path in reversed(found):
        try:
            fmt.read_checkpoint_directory(path)
            return path
        except fmt.CheckpointChangedError:
            continue  # a writer replaced it meanwhile: not damage
        except fmt.CheckpointError as exc:
            problems.append(str(exc))
    detail = "; ".join(problems) or "each was removed while being read"
    raise ValueError(f"no usable checkpoint in {directory}: {detail}")


def load_failure(exc: BaseException) -> str:
    """A failed load's reason, one line (a KeyError's text is its repr)."""
    detail = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
    return " ".join(str(detail).split())


__all__ = ["CHECKPOINTS", "RUN_FILE", "TOKENIZER_FILE", "checkpoint_directory", "load_failure",
           "newest_good_checkpoint", "read_run_file"]
