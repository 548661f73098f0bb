"""Row runners for the faults a careless user or a stranger brings about, not a dying rank:
ranks that disagree (on a root, on the backend), idle strangers at every port, a damaged
checkpoint named by path, and loads while another process saves.

Each runner injects its fault once into fresh processes and returns a ``Run`` (``fault_rows``).
The ranks' functions live here, at module level, so that the harness's workers import them.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from dist_harness import RankFailed, run_ranks
from fault_rows import ROOT, Run, three_checkpoints

MISMATCH_TIMEOUT_S = 60.0  # a rank never told would wait this long: far above any detection
FLOOD = {"at_store": 300, "at_data": {0: 100, 1: 50, 2: 50}}  # 500 idle strangers in all
FLOOD_GOAL_S = 2.0


# ----- disagreements --------------------------------------------------------------------------
def _broadcast_from_self(rank: int, world_size: int) -> dict:
    """Each rank broadcasts with itself as the root: no two ranks agree."""
    from neural_arch import distributed as dist
    x = np.full(8, rank + 1.0)
    start = time.time()
    try:
        dist.broadcast(x, src=rank)
    except dist.DistributedError as e:
        return {"start": start, "end": time.time(), "type": type(e).__name__, "text": str(e)}
    return {"start": start, "end": time.time(), "type": None, "text": "returned"}


def root_mismatch(backend: str, tmp: Path) -> Run:
    """Three ranks call broadcast, each naming itself the root."""
    results = run_ranks(_broadcast_from_self, 3, backend, timeout=MISMATCH_TIMEOUT_S + 30,
                        init_kwargs={"timeout": MISMATCH_TIMEOUT_S})
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    kinds = sorted({str(r["type"]) for r in results})
    named = all("passed root" in r["text"] for r in results)
    ok = kinds == ["CollectiveMismatchError"] and named
    return Run(seconds, ok, f"every rank raised {'/'.join(kinds)}"
               + (" naming each rank's root" if named else f": {results[0]['text'][:120]}"))


def _init_only(rank: int, world_size: int, backends: tuple) -> dict:
    from neural_arch import distributed as dist
    start = time.time()
    try:
        dist.init_process_group(backends[rank], timeout=MISMATCH_TIMEOUT_S)
    except dist.DistributedError as e:
        return {"start": start, "end": time.time(), "type": type(e).__name__, "text": str(e)}
    dist.destroy_process_group()
    return {"start": start, "end": time.time(), "type": None, "text": "joined"}


def mixed_backends(tmp: Path) -> Run:
    """Rank 0 asks for shm, ranks 1 and 2 for tcp."""
    results = run_ranks(_init_only, 3, "none", timeout=MISMATCH_TIMEOUT_S + 30,
                        args=(("shm", "tcp", "tcp"),))
    seconds = max(r["end"] for r in results) - min(r["start"] for r in results)
    kinds = sorted({str(r["type"]) for r in results})
    named = all("'shm'" in r["text"] and "'tcp'" in r["text"] for r in results)
    ok = kinds == ["CollectiveMismatchError"] and named
    return Run(seconds, ok, f"every rank raised {'/'.join(kinds)}"
               + (" naming the backends and the ranks that chose them" if named
                  else f": {results[0]['text'][:120]}"))


# ----- strangers ------------------------------------------------------------------------------
def idle_flood(tmp: Path) -> Run:
    """A 4-rank tcp rendezvous with 500 idle connections at the store and the data ports,
    against the same rendezvous without them; the time is the last rank's init under the flood."""
    sys.path.insert(0, str(ROOT / "tests" / "faults"))
    import test_hostile_connections as hostile
    try:
        (tmp / "quiet").mkdir()
        quiet = hostile.run_flooded_job(tmp / "quiet", "tcp", 4, 0, {})[-1][2]
        (tmp / "flood").mkdir()
        flooded = hostile.run_flooded_job(tmp / "flood", "tcp", 4, **FLOOD)[-1][2]
    except (AssertionError, RankFailed) as e:
        return Run(None, False, f"the job failed under the flood: {str(e)[:200]}")
    delay = flooded - quiet
    return Run(flooded, delay < FLOOD_GOAL_S,
               f"rendezvous and all-reduce exact; the last rank's init took {flooded:.3f} s "
               f"with 500 strangers, {quiet:.3f} s without (goal: under {FLOOD_GOAL_S:g} s more)")


# ----- checkpoints ----------------------------------------------------------------------------
def named_damaged_checkpoint(damage, tmp: Path) -> Run:
    """Three checkpoints, the newest damaged by ``damage`` and then named by path: refused."""
    from checkpoint_training_job import TrainingJob
    from neural_arch.distributed.checkpoint.format import CheckpointCorruptError
    manager, newest, bad_file = three_checkpoints(tmp, damage)
    target = TrainingJob(init_seed=7)
    start = time.perf_counter()
    try:
        info = manager.load_checkpoint(target.model, target.optimizer, path=newest,
                                       restore_rng=False)
    except CheckpointCorruptError as e:
        seconds = time.perf_counter() - start
        ok = e.file == bad_file
        return Run(seconds, ok, f"refused with CheckpointCorruptError naming {e.file}")
    return Run(None, False, f"loaded step {info['step']} from a damaged checkpoint")


_WRITER = """
import sys
sys.path[:0] = [{tests!r}]
from checkpoint_training_job import TrainingJob
from neural_arch.distributed.checkpoint import DistributedCheckpointManager
job, manager = TrainingJob(), DistributedCheckpointManager({directory!r}, max_checkpoints=2)
for step in range({saves}):
    job.step(step)
    manager.save_checkpoint(job.model, job.optimizer, 0, step, 1.0)
"""


def loads_during_saves(tmp: Path, saves: int = 20) -> Run:
    """A writer process saves ``saves`` checkpoints (keeping 2) while this one loads the newest
    in a loop; the time is the slowest load."""
    from checkpoint_training_job import TrainingJob
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    directory = tmp / "checkpoints"
    directory.mkdir()
    code = _WRITER.format(tests=str(ROOT / "tests"), directory=str(directory), saves=saves)
    writer = subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    manager, target = DistributedCheckpointManager(directory), TrainingJob(init_seed=7)
    loads, slowest, failures = 0, 0.0, []
    while writer.poll() is None:
        start = time.perf_counter()
        try:
            manager.load_checkpoint(target.model, target.optimizer, path=None, restore_rng=False)
            loads += 1
        except Exception as e:  # noqa: BLE001 - any failure of a load is the outcome
            if "no checkpoint" not in str(e).lower():  # before the first save
                failures.append(f"{type(e).__name__}: {e}")
        slowest = max(slowest, time.perf_counter() - start)
    err = writer.stderr.read().decode(errors="replace")
    ok = writer.returncode == 0 and not failures and loads > 0
    text = (f"{loads} loads during {saves} saves, each a complete checkpoint; the writer "
            f"exited {writer.returncode}")
    if failures:
        text += f"; {len(failures)} loads failed, first: {failures[0][:120]}"
    if writer.returncode:
        text += f"; writer: {err.strip().splitlines()[-1][:120] if err.strip() else ''}"
    return Run(slowest, ok, text, [writer.pid])
