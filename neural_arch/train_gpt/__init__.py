"""``python -m neural_arch.train_gpt``: train a GPT on a text file, standalone, under the
launcher or mpirun, in ranks it starts itself (``--world-size N``), or one command per rank;
``--sample N`` prints text from the latest checkpoint. See docs/training.md."""
from __future__ import annotations

import sys
from typing import List, Optional

from .args import PROG, UsageError, fail, parse


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse(argv)
    from .self_launch import launch_ranks, starts_its_own_ranks
    if starts_its_own_ranks(args):
        return launch_ranks(args, argv)
    try:
        if args.sample is not None:
            from .sample import sample
            print(sample(args), flush=True)
            return 0
        from .run import train
        train(args)
    except UsageError as exc:
        fail(str(exc))
    return 0


__all__ = ["PROG", "UsageError", "main"]
