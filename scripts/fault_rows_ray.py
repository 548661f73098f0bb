"""Row runner for RayTrainer: a Ray worker SIGKILLed mid-epoch.

``worker_killed`` runs ``tests/ray/ray_jobs.stepped_loop`` (the digits MLP, one SGD step at a
time, a checkpoint every ``INTERVAL`` steps) on 2 workers of a Ray started for the run on this
machine (one node: the workers talk over shared memory), with ``FailureConfig(max_failures=1)``,
and SIGKILLs rank 1's process once it has completed step ``KILL_AFTER``. The row passes when
the run restarts both workers and finishes, the restarted loops resume from a checkpoint having
lost at most ``INTERVAL`` steps, and the final weights equal an uninterrupted run's. The time is
from the kill to the trainer's decision to restart. Ray's processes end with the run
(``ray.shutdown``), so the report's leftover check covers them too.
"""
from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
from pathlib import Path

import numpy as np

from fault_rows import Run, not_run

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "ray"))
# Ray on loopback addresses only (read when Ray is imported; its processes inherit it)
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
TOTAL, INTERVAL, KILL_AFTER = 30, 5, 12
STEP_SLEEP_S = 0.05  # keeps the run long enough to kill it mid-epoch on a busy machine


class _Stamped(io.TextIOBase):
    """stderr that remembers when each line was written (the trainer's restart notice)."""

    def __init__(self) -> None:
        self.lines = []

    def write(self, text: str) -> int:
        self.lines.append((time.time(), text))
        return len(text)


def _steps(out: Path, rank: int) -> list:
    path = out / f"steps.rank{rank}"
    text = path.read_text() if path.exists() else ""
    return [tuple(map(int, line.split())) for line in text.splitlines() if line]


def _kill_past(out: Path, killed: list) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        done = _steps(out, 1)
        if done and done[-1][1] >= KILL_AFTER:
            os.kill(done[-1][0], signal.SIGKILL)
            killed.append((time.time(), done[-1][0]))
            return
        time.sleep(0.01)


def worker_killed(tmp: Path) -> Run:
    try:
        import ray
    except ImportError:
        return not_run("Ray is not installed (pip install 'neural-arch[ray]')")
    import ray_jobs
    from neural_arch.ray import FailureConfig, RayTrainer, RunConfig, ScalingConfig
    if ray.is_initialized():
        return not_run("Ray is already running in this process")
    ray.cloudpickle.register_pickle_by_value(ray_jobs)  # the workers need not find the file
    out = tmp / "out"
    out.mkdir()
    trainer = RayTrainer(ray_jobs.stepped_loop,
                         train_loop_config={"out": str(out), "total": TOTAL,
                                            "interval": INTERVAL, "step_sleep": STEP_SLEEP_S},
                         scaling_config=ScalingConfig(num_workers=2),
                         run_config=RunConfig(name="killed", storage_path=str(tmp),
                                              failure_config=FailureConfig(max_failures=1)))
    killed, notices = [], _Stamped()
    killer = threading.Thread(target=_kill_past, args=(out, killed), daemon=True)
    killer.start()
    try:
        with contextlib.redirect_stderr(notices):
            result = trainer.fit()
    except Exception as exc:
        return Run(None, False, f"the run failed: {str(exc)[:300]}")
    finally:
        killer.join(5)
    if not killed:
        return Run(None, False, "rank 1 was never killed (the run ended first)")
    kill_time, victim = killed[0]
    restarted = [t for t, text in notices.lines if "restarting from" in text]
    done = _steps(out, 1)
    before = [s for p, s in done if p == victim]
    after = [s for p, s in done if p != victim]
    lost = before[-1] + 1 - after[0] if before and after else None
    model, _ = ray_jobs.train_steps(0, TOTAL, 0, 1)
    same = all(np.allclose(result.metrics["weights"][k], np.asarray(v.array), rtol=1e-4,
                           atol=1e-6) for k, v in model.state_dict().items())
    ok = (result.attempts == 2 and lost is not None and 0 <= lost <= INTERVAL
          and after == list(range(after[0], TOTAL)) and same)
    text = (f"both workers restarted from the step-{after[0]} checkpoint ({lost} steps lost, "
            f"interval {INTERVAL}) and finished with an uninterrupted run's weights" if ok else
            f"attempts {result.attempts}, steps before {before[-3:]}, after {after[:3]}, "
            f"weights {'equal' if same else 'differ'}")
    return Run(restarted[0] - kill_time if restarted else None, ok, text, [victim])
