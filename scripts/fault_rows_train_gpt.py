"""Row runners for ``python -m neural_arch.train_gpt`` used carelessly: two runs started into
one ``--out-dir``.

Each runner injects its fault once into fresh processes and returns a ``Run`` (``fault_rows``).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

from fault_rows import ROOT, Run, wait_for

TINY = ["--hidden-size", "32", "--layers", "1", "--attention-heads", "2", "--max-seq-length",
        "8", "--batch-size", "2", "--no-progress", "--log-interval", "1", "--epochs", "100"]
FIRST_STEPS = 2000  # several seconds of training: the second run starts well inside them
START_LIMIT_S = 60.0
LOCK_FILE = "train.lock"


def _command(out: Path, text: Path, steps: int) -> list:
    return [sys.executable, "-m", "neural_arch.train_gpt", "--data", str(text), *TINY,
            "--max-steps", str(steps), "--save-interval", "50", "--out-dir", str(out)]


def _holder_pid(out: Path):
    try:
        return json.loads((out / LOCK_FILE).read_text())["pid"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _whole_metrics(out: Path, steps: int) -> str:
    """'' when metrics.jsonl is all JSON lines with train records for steps 1..steps."""
    try:
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    except (OSError, ValueError) as exc:
        return f"metrics.jsonl unreadable: {exc}"
    train = [r["step"] for r in records if r.get("kind") == "train"]
    return "" if train == list(range(1, steps + 1)) else (
        f"metrics.jsonl has train steps {train[:3]}...{train[-3:]} of {len(train)} records")


def two_runs_one_out_dir(tmp: Path) -> Run:
    """A run trains into ``out``; a second one is started into the same ``out`` while the first
    holds it. The time is the second run's, from its start to its exit."""
    text, out = tmp / "text.txt", tmp / "out"
    words = "the model reads a small text and learns its letters".split()
    text.write_text(" ".join(words[(i * 7) % len(words)] for i in range(80)) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with open(tmp / "first.err", "w") as first_err:
        first = subprocess.Popen(_command(out, text, FIRST_STEPS), stdout=subprocess.DEVNULL,
                                 stderr=first_err, cwd=ROOT, env=env)
    pids = [first.pid]
    try:
        if not wait_for(lambda: _holder_pid(out) == first.pid, START_LIMIT_S, [first]):
            return Run(None, False, f"the first run never held {out / LOCK_FILE} (exit code "
                       f"{first.poll()})", pids)
        start = time.perf_counter()
        second = subprocess.Popen(_command(out, text, 5), stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True, cwd=ROOT, env=env)
        pids.append(second.pid)
        err = second.communicate(timeout=START_LIMIT_S)[1]
        seconds = time.perf_counter() - start
        first_ran_on = first.poll() is None
        first_code = first.wait(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    lines = err.strip().splitlines()
    named = len(lines) == 1 and f"pid {first.pid}" in lines[0] and \
        f"host {socket.gethostname()}" in lines[0]
    damage = _whole_metrics(out, FIRST_STEPS)
    ok = second.returncode == 2 and named and first_ran_on and first_code == 0 and not damage
    if ok:
        return Run(seconds, True, f"the second run exited 2 naming the holder (pid "
                   f"{first.pid}); the first finished all {FIRST_STEPS} steps with a whole "
                   f"metrics.jsonl", pids)
    return Run(None, False, f"second run: exit code {second.returncode}, "
               f"{(lines or [''])[-1][:160]!r}; first run: exit code {first_code}"
               f"{'' if first_ran_on else ', ended before the second did'}"
               f"{'; ' + damage if damage else ''}", pids)
