"""The row runners of the fault-injection report: each injects one fault once and measures it.

A runner takes a fresh scratch directory and returns a ``Run``: the seconds from the fault to
what its row measures (``None`` when that never happened), whether the outcome was the expected
one, the outcome in words, and the pids of the processes it started (the report looks for
those, and for their /dev/shm segments, once the run is over). What was left behind is judged
by the report for every row alike; a runner only cleans up what it normally would.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Callable, List, Optional

import fault_injection_job
from dist_harness import free_port
from fault_injector import run_fault

ROOT = Path(__file__).resolve().parents[1]
TRAINING_JOB = ROOT / "tests" / "checkpoint_training_job.py"
FAULT_JOB = Path(fault_injection_job.__file__)
GONE_LIMIT_S = 30.0  # how long a launcher-death run waits for the last worker to end


@dataclass
class Run:
    seconds: Optional[float]
    ok: bool
    outcome: str
    pids: List[int] = field(default_factory=list)
    not_run: bool = False  # the fault cannot be injected here (no mpiexec, not root, ...)


def not_run(reason: str) -> Run:
    return Run(None, False, f"not run: {reason}", not_run=True)


def wait_for(predicate: Callable[[], bool], limit: float, procs=()) -> bool:
    """Poll ``predicate`` until it holds, ``limit`` passes, or one of ``procs`` exits."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        if any(p.poll() is not None for p in procs):
            break
        time.sleep(0.01)
    return predicate()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


# ----- collective faults ----------------------------------------------------------------------
def collective(fault: str, backend: str, victim: int, tmp: Path, group=None) -> Run:
    """SIGKILL, SIGSTOP, SIGSTOP right after init or a closed socket at rank ``victim`` of 3
    looping all-reduces (on ``new_group(group)`` when given: the victim may be outside it)."""
    outcome = run_fault(fault, backend, 3, victim, tmp, detect_limit=20.0, group=group)
    reports = {r: outcome.errors.get(r) for r in outcome.survivors}
    named = sorted({e["peer"] for e in reports.values() if e})
    kinds = sorted({e["type"] for e in reports.values() if e})
    worst = outcome.worst_detection_s
    pids = [json.loads(p.read_text())["pid"] for p in tmp.glob("looping_*.json")]
    if fault == "stop_early":  # the victim stopped before it looped
        pids.append(json.loads((tmp / "injected.json").read_text())["pid"])
    if worst is None:
        missing = [r for r, e in reports.items() if e is None]
        return Run(None, False, f"ranks {missing} raised nothing within 20 s", pids)
    shared = sum("heartbeat:" in e["message"] for e in reports.values())
    via = ("the heartbeat" if shared == len(reports) else "the transport" if not shared
           else "the transport, then the heartbeat's shared report")
    # A closed socket breaks the link between the victim and the next rank: either end may be
    # the one named (each end sees the other go), but no rank off that link.
    blamable = {victim, (victim + 1) % 3} if fault == "close_socket" else {victim}
    return Run(worst, kinds == ["PeerFailureError"] and bool(named) and set(named) <= blamable,
               f"every survivor raised {'/'.join(kinds)} naming rank(s) {named} (found by {via})",
               pids)


def netns_link_cut(tmp: Path) -> Run:
    """Two nodes in network namespaces, 2 ranks each; node 0's link goes down mid-run."""
    import test_multinode_netns as netns
    reason = netns.namespaces_unavailable()
    if reason:
        return not_run(reason)
    with netns.NetnsPair() as pair:
        port, secret = 20000 + secrets.randbelow(40000), secrets.token_hex(16)
        launchers = [pair.launch(n, port, secret, tmp, 90.0) for n in (0, 1)]
        looping = lambda: all((tmp / f"looping_{r}.json").exists() for r in range(4))
        if not wait_for(looping, 60, launchers):
            netns.finish(launchers, 0)
            return Run(None, False, "the 2-node job did not start")
        pids = [json.loads((tmp / f"looping_{r}.json").read_text())["pid"] for r in range(4)]
        cut = time.time()
        pair.cut()
        codes = netns.finish(launchers, 60)
        errors = [json.loads(p.read_text()) for p in sorted(tmp.glob("error_*.json"))]
    worst = max((e["time"] - cut for e in errors), default=None)
    ok = len(errors) == 4 and all(c not in (0, None) for c in codes)
    return Run(worst, ok, f"{len(errors)} of 4 ranks raised {sorted({e['type'] for e in errors})}; "
               f"launcher exit codes {codes}", pids)


# ----- checkpoints ----------------------------------------------------------------------------
def three_checkpoints(tmp: Path, damage: Callable[[Path], str]) -> tuple:
    """(manager, path of the newest, the file ``damage`` spoilt in it) after three saves."""
    from checkpoint_training_job import TrainingJob
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    job, manager = TrainingJob(), DistributedCheckpointManager(tmp)
    for step in range(3):
        job.step(step)
        newest = manager.save_checkpoint(job.model, job.optimizer, 0, step, 1.0)
    return manager, newest, damage(Path(newest))


def damaged_checkpoint(damage: Callable[[Path], str], tmp: Path) -> Run:
    """Three checkpoints, the newest damaged by ``damage``; loading the latest falls back."""
    from checkpoint_training_job import TrainingJob
    manager, _, bad_file = three_checkpoints(tmp, damage)
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logger = logging.getLogger("neural_arch.distributed.checkpoint")
    logger.addHandler(handler)
    try:
        start = time.perf_counter()
        target = TrainingJob(init_seed=7)
        # path=None: the newest checkpoint, with the fallback to older good ones shown here.
        info = manager.load_checkpoint(target.model, target.optimizer, path=None,
                                       restore_rng=False)
        seconds = time.perf_counter() - start
    finally:
        logger.removeHandler(handler)
    warned = any(bad_file in r.getMessage() for r in records)
    ok = info["step"] == 1 and warned
    return Run(seconds, ok, f"load fell back to step {info['step']} with a warning naming "
               f"{bad_file}" if ok else f"loaded step {info['step']}")


def truncate(path: Path) -> str:
    target = path / "model.safetensors"
    with open(target, "r+b") as f:
        f.truncate(target.stat().st_size // 2)
    return "model.safetensors"


def flip_byte(path: Path) -> str:
    target = path / "optimizer.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01
    target.write_bytes(bytes(data))
    return "optimizer.safetensors"


# ----- the launcher ---------------------------------------------------------------------------
class Launch:
    """``script`` under the launcher with 2 workers; its stderr lines are timestamped."""

    def __init__(self, script: Path, *args, backend: str = "shm", max_restarts: int = 0) -> None:
        self.lines: list = []
        cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", str(script),
               "--nproc_per_node=2", f"--backend={backend}", f"--master_port={free_port()}",
               f"--max_restarts={max_restarts}", "--", *map(str, args)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.time(), line))

    def finish(self, limit: float = 150.0) -> int:
        try:
            return self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
        finally:
            self._reader.join(5)


def _training(out: Path, *args, max_restarts: int = 0) -> Launch:
    return Launch(TRAINING_JOB, "--out", out, "--steps", 12, "--save_every", 3, *args,
                  max_restarts=max_restarts)


def _paused_pid(run: Launch, out: Path, rank: int) -> int:
    path = out / f"paused_rank{rank}.json"
    wait_for(path.exists, 90, [run.proc])
    return json.loads(path.read_text())["pid"]


def _final_weights(out: Path) -> dict:
    from neural_arch.nn.serialization import load_state_dict_file
    return dict(load_state_dict_file(out / "final.safetensors"))


def _same(a: dict, b: Optional[dict]) -> bool:
    import numpy as np
    return b is not None and a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _starts(out: Path) -> list:
    return sorted(json.loads(p.read_text())["start_step"] for p in out.glob("start_rank*.json")
                  if json.loads(p.read_text())["resumed"])


@lru_cache(maxsize=1)
def reference_weights() -> Optional[dict]:
    """The final weights of an uninterrupted run, trained once per report (None: it failed)."""
    with tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
        return _final_weights(Path(tmp)) if _training(Path(tmp)).finish() == 0 else None


def sigterm_then_resume(tmp: Path) -> Run:
    """SIGTERM to the launcher mid-epoch; the relaunch must end as an uninterrupted run."""
    run = _training(tmp, "--pause_at", 4, "--pause_rank", 0)
    pids = [_paused_pid(run, tmp, 0)]
    sent = time.time()
    run.proc.send_signal(signal.SIGTERM)
    code, stopped = run.finish(), time.time() - sent
    resumed = _training(tmp)
    ok = code == 128 + signal.SIGTERM and resumed.finish() == 0 and \
        _starts(tmp) == [5, 5] and _same(_final_weights(tmp), reference_weights())
    return Run(stopped, ok, "saved at step 4 and exited; the relaunch resumed at step 5 and "
               "ended with weights identical to an uninterrupted run" if ok else
               f"exit code {code}", pids)


def worker_killed_restart(tmp: Path) -> Run:
    """SIGKILL to a worker under --max_restarts=1; the restarted job must resume and match."""
    run = _training(tmp, "--pause_at", 7, "--pause_rank", 1, max_restarts=1)
    victim = _paused_pid(run, tmp, 1)
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    code = run.finish()
    noticed = [t for t, line in run.lines if "restarting all 2 workers" in line]
    ok = code == 0 and _starts(tmp) == [6, 6] and _same(_final_weights(tmp), reference_weights())
    return Run(noticed[0] - killed if noticed else None, ok,
               "the launcher restarted both workers, which resumed at step 6 and ended with "
               "weights identical to an uninterrupted run" if ok else f"exit code {code}",
               [victim])


def launcher_killed(backend: str, tmp: Path) -> Run:
    """SIGKILL to the launcher of 2 looping all-reduce workers: until the last worker is gone."""
    run = Launch(FAULT_JOB, "--out", tmp, "--backend", backend, "--timeout", 60, backend=backend)
    looping = lambda: all((tmp / f"looping_{r}.json").exists() for r in (0, 1))
    if not wait_for(looping, 90, [run.proc]):
        run.finish(0.1)
        return Run(None, False, "the job did not start looping")
    pids = [json.loads((tmp / f"looping_{r}.json").read_text())["pid"] for r in (0, 1)]
    killed = time.time()
    os.kill(run.proc.pid, signal.SIGKILL)
    gone = wait_for(lambda: not any(alive(p) for p in pids), GONE_LIMIT_S)
    seconds = time.time() - killed if gone else None
    run.finish(10)
    if not gone:
        return Run(None, False, f"workers {[p for p in pids if alive(p)]} still ran "
                   f"{GONE_LIMIT_S:g} s after the launcher died", pids + [run.proc.pid])
    return Run(seconds, True, "both workers ended with their launcher", pids + [run.proc.pid])
