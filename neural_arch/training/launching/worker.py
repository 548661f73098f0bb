"""What each worker process runs: the pickled recipe, and a note of how it ended.

The launcher starts ``run_worker(recipe, result_dir)`` in every worker. Rank 0 leaves the
recipe's return value in ``result_dir``; a rank whose recipe raises leaves the exception's
text (with the time, so the parent can tell the first failure from its consequences: a peer
of a failed rank fails too, a moment later) and then raises it again, so that its traceback
reaches the console and its exit code the launcher. A rank that dies without raising
(a signal, ``os._exit``) leaves nothing; the launcher's exit status names it. A recipe that
names what an unguarded script defines only below its training call is explained
(``main_import``).
"""
from __future__ import annotations

import json
import os
import pickle
import time
from typing import Any

from . import main_import

RESULT_FILE = "result.pickle"


def error_file(result_dir: str, rank: int) -> str:
    return os.path.join(result_dir, f"rank{rank}.error.json")


def _write_atomically(path: str, data: bytes) -> None:
    """Written under a temporary name, then renamed: the parent never reads half a file."""
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def _rank() -> int:
    from ...distributed.rendezvous.env import resolve
    return resolve(master_needed=False).rank


def _load(recipe: bytes) -> Any:
    try:
        return pickle.loads(recipe)
    except AttributeError as exc:
        explained = main_import.missing_from_main(exc)
        if explained is None:
            raise
        raise explained from exc


def run_worker(recipe: bytes, result_dir: str) -> None:
    rank = _rank()
    try:
        result = _load(recipe)()
        if rank == 0:
            _write_atomically(os.path.join(result_dir, RESULT_FILE),
                              pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    except BaseException as exc:
        record = {"rank": rank, "time": time.time(), "error": f"{type(exc).__name__}: {exc}"}
        try:
            _write_atomically(error_file(result_dir, rank), json.dumps(record).encode())
        except OSError:
            pass  # the exit code still tells the parent that this rank failed
        raise
