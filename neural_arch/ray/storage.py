"""The run's folder on storage, shared by the workers (which write) and the driver (which reads).

``checkpoint_NNNNNN/`` holds the directory each worker reported with report number NNNNNN
(several workers' files merge into one, as in Ray Train); ``.reports/NNNNNN.rankR.pkl`` records
that rank R made that report, with its metrics. A report counts, and its checkpoint is
registered, once every rank of the attempt has recorded it: a worker killed before its report
leaves the report incomplete, and a restart resumes from the newest complete one. The record is
written after the checkpoint files and renamed into place, so a complete report never points at
a half-copied checkpoint.
"""
from __future__ import annotations

import os
import pickle
import re
import shutil
from typing import Any, Dict, List, NamedTuple, Optional

REPORTS = ".reports"
_RECORD = re.compile(r"^(\d{6})\.rank(\d+)\.pkl$")


class Report(NamedTuple):
    index: int
    metrics: Dict[str, Any]     # worker 0's
    has_checkpoint: bool        # whether any worker reported a checkpoint with it


def checkpoint_dir(run_dir: str, index: int) -> str:
    return os.path.join(run_dir, f"checkpoint_{index:06d}")


def write_record(run_dir: str, index: int, rank: int, metrics: Dict[str, Any],
                 has_checkpoint: bool) -> None:
    folder = os.path.join(run_dir, REPORTS)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{index:06d}.rank{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump({"metrics": metrics, "checkpoint": has_checkpoint}, f)
    os.replace(path + ".tmp", path)


def _records(run_dir: str) -> Dict[int, Dict[int, str]]:
    """index -> rank -> record file."""
    found: Dict[int, Dict[int, str]] = {}
    try:
        names = os.listdir(os.path.join(run_dir, REPORTS))
    except FileNotFoundError:
        return found
    for name in names:
        match = _RECORD.match(name)
        if match:
            found.setdefault(int(match[1]), {})[int(match[2])] = name
    return found


def complete_reports(run_dir: str, world_size: int) -> List[Report]:
    """The reports every rank made, oldest first."""
    done = []
    for index, ranks in sorted(_records(run_dir).items()):
        if set(ranks) != set(range(world_size)):
            continue
        records = []
        for rank in range(world_size):
            with open(os.path.join(run_dir, REPORTS, ranks[rank]), "rb") as f:
                records.append(pickle.load(f))
        done.append(Report(index, records[0]["metrics"], any(r["checkpoint"] for r in records)))
    return done


def ranks_that_reported(run_dir: str) -> Dict[int, set]:
    """index -> the ranks that recorded it (complete or not)."""
    return {index: set(ranks) for index, ranks in _records(run_dir).items()}


def latest_checkpoint(reports: List[Report], run_dir: str) -> Optional[str]:
    with_checkpoint = [r.index for r in reports if r.has_checkpoint]
    return checkpoint_dir(run_dir, with_checkpoint[-1]) if with_checkpoint else None


def prune_checkpoints(run_dir: str, reports: List[Report], keep: Optional[int]) -> None:
    """Delete registered checkpoints older than the newest ``keep`` (None: keep all)."""
    if keep is None:
        return
    registered = [r.index for r in reports if r.has_checkpoint]
    for index in registered[:-keep]:
        shutil.rmtree(checkpoint_dir(run_dir, index), ignore_errors=True)


def drop_incomplete(run_dir: str, after: int) -> None:
    """Remove every record and checkpoint numbered above ``after``: what a failed attempt began
    but did not complete, so the restart's reports of the same numbers start clean."""
    for index, ranks in _records(run_dir).items():
        if index > after:
            for name in ranks.values():
                os.unlink(os.path.join(run_dir, REPORTS, name))
    for name in os.listdir(run_dir):
        match = re.match(r"^checkpoint_(\d{6})$", name)
        if match and int(match[1]) > after:
            shutil.rmtree(os.path.join(run_dir, name), ignore_errors=True)
