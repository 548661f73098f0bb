"""Row runners for resuming from damaged checkpoints that only some ranks can see.

``tp_rank_checkpoint_damaged`` trains ``train_gpt --tp 2`` for four steps (checkpoints at steps
2 and 4, each tensor-parallel rank its own shards in a directory of its own), flips a byte in
tensor-parallel rank 1's newest checkpoint, and resumes: both ranks must go on from step 2, the
newest step intact for both, and rank 1 must name the damaged file. The time is from the start
of the resumed job to the line that names it. Returns a ``Run`` (``fault_rows``).
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np

from dist_harness import free_port
from fault_rows import ROOT, Run
from resume_agreement_job import BAD_FILE, damage, step_dir

FLAGS = ["--hidden-size", 32, "--layers", 2, "--attention-heads", 2, "--max-seq-length", 16,
         "--batch-size", 8, "--log-interval", 1, "--eval-interval", 100, "--no-progress",
         "--save-interval", 2, "--tp", 2, "--backend", "shm"]
LIMIT_S = 120.0


def _text(path: Path) -> Path:
    words = ["the", "model", "reads", "a", "small", "text", "and", "learns", "its", "letters"]
    path.write_text(" ".join(np.random.default_rng(0).choice(words, size=900)) + "\n")
    return path


class _TrainGPT:
    """``train_gpt`` under the launcher with 2 workers; its output lines are timestamped."""

    def __init__(self, *args) -> None:
        self.lines: list = []
        cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--nproc_per_node=2",
               f"--master_port={free_port()}", "-m", "neural_arch.train_gpt", *map(str, args)]
        self.start = time.time()
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     env={**os.environ, "PYTHONPATH": str(ROOT)},
                                     start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append((time.time(), line))

    def finish(self) -> int:
        try:
            return self.proc.wait(LIMIT_S)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, 9)
            return self.proc.wait(10)
        finally:
            self._reader.join(5)

    def first(self, text: str):
        """(seconds from the start, line) of the first line holding ``text``, or None."""
        return next(((t - self.start, line) for t, line in self.lines if text in line), None)


def tp_rank_checkpoint_damaged(tmp: Path) -> Run:
    out, data = tmp / "run", _text(tmp / "text.txt")
    first = _TrainGPT("--data", data, *FLAGS, "--max-steps", 4, "--out-dir", out)
    if first.finish() != 0:
        return Run(None, False, "the first run failed: "
                   + "".join(line for _, line in first.lines[-3:]).strip()[-200:],
                   [first.proc.pid])
    bad_step = step_dir(out, 1, 4)
    damage(bad_step)
    resumed = _TrainGPT("--data", data, *FLAGS, "--max-steps", 6, "--out-dir", out, "--resume")
    code = resumed.finish()
    pids = [first.proc.pid, resumed.proc.pid]
    named = resumed.first(f"{bad_step} is unusable: {BAD_FILE} is bad")
    from_two = resumed.first("train step 3/6") is not None
    both_saved = all(os.path.isdir(step_dir(out, column, 6)) for column in (0, 1))
    ok = code == 0 and named is not None and from_two and both_saved
    if ok:
        return Run(named[0], True, "both tensor-parallel ranks resumed from step 2, the newest "
                   "step intact for both, and went on to step 6; rank 1 named the damaged "
                   f"file ({BAD_FILE}, SHA-256 differs)", pids)
    tail = "".join(line for _, line in resumed.lines[-2:]).strip()[-200:]
    return Run(named[0] if named else None, False,
               f"exit code {code}; bad file named: {named is not None}; resumed from step 2: "
               f"{from_two}; step 6 saved by both: {both_saved}; last output: {tail}", pids)
