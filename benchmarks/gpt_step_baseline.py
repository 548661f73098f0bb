"""The GPT step of an earlier neural_arch commit, timed beside the current one.

``bench_gpt_step.py --baseline REF`` extracts ``neural_arch/`` as it was at git revision REF
(``git archive``) into a temporary folder and starts this file there as a child process per
rank, with that folder first on its path: the child builds the same GPT, batch and AdamW as
the benchmark's ``Pair`` (same seeds, so the same weights and the same first loss) and takes
one step whenever its parent asks, over a pipe. The parent then interleaves the three steps
(the current commit's, torch's, the earlier commit's) as it does two. At p = 2 the two
children form a data-parallel job of their own (our DDP on shm, over a port of their own).

The child uses only what every commit of the GPT's lifetime offers (``GPT``, ``GPTConfig``,
``AdamW``, ``manual_seed``, ``init_process_group``, ``DistributedDataParallel``).
"""
from __future__ import annotations

import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from typing import Dict, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_REPLY_TIMEOUT_S = 900.0  # the first step compiles the earlier commit's Numba kernels
# The parent's own job (launcher variables) must not leak into the children's job.
_JOB_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
             "MASTER_PORT", "GROUP_RANK", "NODE_RANK", "TORCHELASTIC_RUN_ID")


def extract(ref: str) -> Tuple[str, str]:
    """(folder holding ``neural_arch/`` at ``ref``, the commit's short hash)."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", f"{ref}^{{commit}}"], cwd=ROOT,
                                check=True, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"--baseline {ref!r}: not a commit of this repository ({exc})")
    folder = tempfile.mkdtemp(prefix=f"gpt-baseline-{commit}-")
    archive = subprocess.Popen(["git", "archive", commit, "neural_arch"], cwd=ROOT,
                               stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", folder], stdin=archive.stdout, check=True, timeout=120)
    if archive.wait(timeout=120) != 0:
        raise SystemExit(f"git archive {commit} neural_arch failed")
    return folder, commit


class BaselineStep:
    """A child process holding the earlier commit's GPT; ``step()`` runs one of its steps."""

    def __init__(self, folder: str, sizes, data_seed: int,
                 job: Optional[Dict[str, int]] = None) -> None:
        env = {k: v for k, v in os.environ.items()
               if k not in _JOB_VARS and not k.startswith("NEURAL_ARCH_RUN")}
        env["PYTHONPATH"] = folder
        self.proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--child"], cwd=folder, env=env,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self._send(dict(sizes=list(sizes), data_seed=data_seed, job=job))
        self.first_loss = float(self._reply())

    def _send(self, message: object) -> None:
        self.proc.stdin.write(json.dumps(message) + "\n")
        self.proc.stdin.flush()

    def _reply(self) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], _REPLY_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.close()
            raise RuntimeError(f"the baseline child (pid {self.proc.pid}) gave no answer "
                               f"within {_REPLY_TIMEOUT_S:.0f} s (exit code "
                               f"{self.proc.poll()}); its stderr is above")
        return line.strip()

    def step(self) -> float:
        self._send("step")
        return float(self._reply())

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self._send("quit")
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(timeout=30)


def remove(folder: str) -> None:
    shutil.rmtree(folder, ignore_errors=True)


def _child() -> None:
    """Runs in the earlier commit's folder: build, answer the first loss, then step on demand."""
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = "1"
    import numpy as np
    from neural_arch.core import manual_seed
    from neural_arch.models import GPT, GPTConfig
    from neural_arch.optim import AdamW

    setup = json.loads(sys.stdin.readline())
    layers, heads, width, block, batch = setup["sizes"]
    vocab, lr = 65, 1e-3  # bench_gpt_step's VOCAB and LR
    job = setup["job"]
    if job:
        from neural_arch import distributed as dist
        dist.init_process_group("shm", init_method=f"tcp://127.0.0.1:{job['port']}",
                                world_size=job["world"], rank=job["rank"])
    manual_seed(0)
    model = GPT(GPTConfig(vocab_size=vocab, n_layer=layers, n_head=heads, n_embd=width,
                          block_size=block))
    optimizer = AdamW(list({id(p): p for p in model.parameters()}.values()), lr=lr)
    rng = np.random.default_rng(setup["data_seed"])
    idx = rng.integers(0, vocab, (batch, block))
    targets = rng.integers(0, vocab, (batch, block))
    if job:
        model = dist.DistributedDataParallel(model)

    def step() -> float:
        optimizer.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        optimizer.step()
        return float(loss.item())

    print(repr(step()), flush=True)
    for line in sys.stdin:
        if json.loads(line) != "step":
            break
        print(repr(step()), flush=True)
    if job:
        dist.destroy_process_group()


if __name__ == "__main__" and sys.argv[1:] == ["--child"]:
    _child()
