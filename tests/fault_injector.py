"""Start the all-reduce job of ``fault_injection_job``, inject a fault into one rank and
measure how each survivor learns of it.

``run_fault(fault, backend, world_size, victim, workdir)`` starts the ranks, waits until all of
them loop, injects the fault into ``victim`` and returns a ``FaultOutcome``: ``kill``
(SIGKILL), ``stop`` (SIGSTOP: a hung rank), ``close_socket`` (the victim shuts down its TCP
connection to the next rank while a collective runs), ``exit`` (the victim's program ends with
exit code 0 between two collectives, without ``destroy_process_group``), ``raise`` (an
exception escapes the victim's program between two collectives), ``stop_early`` (the victim
stops itself right after ``init_process_group``, before its first collective, while its
heartbeat is still connecting). With ``group=[...]`` only those ranks loop, on
``new_group(group)``; the others wait idle, so a fault in one of them hits a job whose
collectives do not involve it. Every process is killed and reaped before it returns; leftover
processes and shared-memory segments are reported, not hidden.
``run_mpi_fault`` does the same to a job started by ``mpiexec`` (backend ``mpi``);
``start_ranks`` and ``launch_env`` start a job for tests that inject faults of their own.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import fault_injection_job
from dist_harness import free_port
from leftovers import alive, segments_of
from mpiexec_launch import start_until_launched

JOB = os.path.abspath(fault_injection_job.__file__)
FAULTS = ("kill", "stop", "close_socket", "exit", "raise", "stop_early")
# Faults the victim brings about itself, between two collectives, once told to.
OWN_FAULTS = ("exit", "raise")
_READY_LIMIT_S = 60.0


@dataclass
class FaultOutcome:
    fault: str
    backend: str
    world_size: int
    victim: int
    injected_at: float
    errors: dict = field(default_factory=dict)  # rank -> what its failed collective raised
    exit_codes: dict = field(default_factory=dict)  # rank -> exit code (None under mpiexec)
    stuck: list = field(default_factory=list)  # survivors that could not exit on their own
    finished: list = field(default_factory=list)  # ranks whose loop ended normally
    launcher_exit: Optional[int] = None  # mpiexec's exit code
    leftover_pids: list = field(default_factory=list)
    leftover_segments: list = field(default_factory=list)
    logs: str = ""

    @property
    def survivors(self) -> list:
        return [r for r in range(self.world_size) if r != self.victim]

    def detection_s(self, rank: int) -> Optional[float]:
        error = self.errors.get(rank)
        return None if error is None else error["time"] - self.injected_at

    @property
    def worst_detection_s(self) -> Optional[float]:
        times = [self.detection_s(r) for r in self.survivors]
        return None if None in times else max(times)


def wait_for(predicate, limit: float, procs) -> bool:
    """Whether ``predicate()`` holds within ``limit`` seconds; once one of ``procs`` (None: no
    processes to watch) has ended, it is asked one last time."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        if procs is not None and any(p.poll() is not None for p in procs):
            return predicate()
        time.sleep(0.01)
    return predicate()


def launch_env(world_size: int, port: int, secret: str) -> dict:
    """The variables a launcher gives every rank of a one-host job (but RANK and LOCAL_RANK)."""
    return {"WORLD_SIZE": str(world_size), "LOCAL_WORLD_SIZE": str(world_size),
            "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "NEURAL_ARCH_SECRET": secret}


def start_ranks(out: Path, backend: str, world_size: int, env: dict, args=()) -> list:
    """Start the ranks of a job running ``fault_injection_job`` (``args`` are its options past
    ``--out`` and ``--backend``), each in a session of its own, logging to
    ``out/rank<R>.log``, with ``env`` (see ``launch_env``) and its RANK; for ``mpi``, one
    mpiexec starts them all and logs to ``out/mpiexec.log``. Returns the processes started
    here."""
    command = [sys.executable, JOB, "--out", str(out), "--backend", backend, *args]
    if backend == "mpi":
        env = {**env, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
               "OMPI_MCA_rmaps_base_oversubscribe": "1"}
        argv = ["mpiexec", "-n", str(world_size), "--oversubscribe", *command]
        return [_start_mpiexec(out, argv, env)]
    return [_start(out / f"rank{rank}.log", command,
                   {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)})
            for rank in range(world_size)]


def _start(log_path: Path, argv: list, env: dict) -> subprocess.Popen:
    with open(log_path, "wb") as log:
        return subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _start_mpiexec(out: Path, argv: list, env: dict) -> subprocess.Popen:
    """``mpiexec`` started once one of its ranks has (each leaves ``started_<R>.json``, see
    ``fault_injection_job.worker``), or once it ended; started again if its own launcher failed."""
    return start_until_launched(lambda: _start(out / "mpiexec.log", argv, env),
                                lambda: any(out.glob("started_*.json")),
                                out / "mpiexec.log", _READY_LIMIT_S)


def run_fault(fault: str, backend: str, world_size: int, victim: int, workdir: Path,
              detect_limit: float = 30.0, env: Optional[dict] = None,
              group: Optional[list] = None) -> FaultOutcome:
    """Start the job, inject ``fault`` into rank ``victim``, collect what every rank saw.

    ``group``: the ranks that loop on ``new_group(group)`` (default: all, on the world group).
    """
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
    if not 0 <= victim < world_size:
        raise ValueError(f"victim {victim} is outside [0, {world_size})")
    if group is not None and (len(set(group)) != len(group) or len(group) < 2
                              or not all(0 <= r < world_size for r in group)):
        raise ValueError(f"group must hold 2 or more distinct ranks of [0, {world_size}), "
                         f"got {group!r}")
    if fault == "stop_early" and group is not None:
        raise ValueError("stop_early stops the victim before new_group: use no group with it")
    out = Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    base_env = {**os.environ, **launch_env(world_size, free_port(), secrets.token_hex(16)),
                **(env or {})}
    if fault == "close_socket":
        base_env["FAULT_CLOSE_SOCKET_RANK"] = str(victim)
    if fault in OWN_FAULTS:
        base_env.update(FAULT_RANK=str(victim), FAULT_OWN=fault)
    if fault == "stop_early":
        base_env["FAULT_STOP_EARLY_RANK"] = str(victim)
    extra = [] if group is None else ["--group", ",".join(str(r) for r in group)]
    procs = []
    outcome = FaultOutcome(fault, backend, world_size, victim, 0.0)
    try:
        procs += start_ranks(out, backend, world_size, base_env, extra)
        if fault == "stop_early":  # the victim stops itself; the others may never loop
            ready = lambda: (out / "injected.json").exists()
        else:
            ready = lambda: all((out / f"looping_{r}.json").exists() for r in range(world_size))
        if not wait_for(ready, _READY_LIMIT_S, procs):
            raise RuntimeError(f"the job did not start looping:\n{_logs(out, world_size)}")
        outcome.injected_at = _inject(fault, procs[victim], out)
        survivors = [r for r in range(world_size) if r != victim]
        wait_for(lambda: all((out / f"error_{r}.json").exists() or procs[r].poll() is not None
                              for r in survivors), detect_limit, None)
    finally:
        pids = [p.pid for p in procs]
        _stop_all(procs, victim if fault in ("kill", "stop", "stop_early") else None)
    for rank in range(world_size):
        outcome.exit_codes[rank] = procs[rank].returncode
    outcome.stuck = [r for r in outcome.survivors if procs[r].returncode == -signal.SIGKILL]
    return _collect(outcome, out, pids)


def _collect(outcome: FaultOutcome, out: Path, pids: list) -> FaultOutcome:
    for rank in range(outcome.world_size):
        path = out / f"error_{rank}.json"
        if path.exists():
            outcome.errors[rank] = json.loads(path.read_text())
        if (out / f"done_{rank}.json").exists():
            outcome.finished.append(rank)
    outcome.leftover_pids = [pid for pid in pids if alive(pid)]
    outcome.leftover_segments = segments_of(pids)
    outcome.logs = _logs(out, outcome.world_size)
    return outcome


def run_mpi_fault(fault: str, world_size: int, victim: int, workdir: Path,
                  detect_limit: float = 30.0, exit_limit: float = 10.0, timeout: float = 120.0,
                  env: Optional[dict] = None) -> FaultOutcome:
    """``run_fault`` for a job of ``world_size`` ranks started by plain ``mpiexec``. Once the
    survivors have reported (or the job ended), they get ``exit_limit`` seconds to end on their
    own before anything is killed; ``timeout`` is the job's collective timeout."""
    if fault not in ("kill", "stop") + OWN_FAULTS:
        raise ValueError(f"fault must be one of {('kill', 'stop') + OWN_FAULTS}, got {fault!r}")
    out = Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    job_env = {**os.environ, **(env or {})}
    if fault in OWN_FAULTS:
        job_env.update(FAULT_RANK=str(victim), FAULT_OWN=fault)
    outcome = FaultOutcome(fault, "mpi", world_size, victim, 0.0)
    pids: list = []
    (job,) = start_ranks(out, "mpi", world_size, job_env, ["--timeout", str(timeout)])
    try:
        looping = lambda: all((out / f"looping_{r}.json").exists() for r in range(world_size))
        if not wait_for(looping, _READY_LIMIT_S, [job]):
            raise RuntimeError("the job did not start looping:\n"
                               + (out / "mpiexec.log").read_text(errors="replace")[-3000:])
        pids = [json.loads((out / f"looping_{r}.json").read_text())["pid"]
                for r in range(world_size)]
        if fault in OWN_FAULTS:
            outcome.injected_at = _inject(fault, None, out)
        else:
            outcome.injected_at = time.time()
            os.kill(pids[victim], signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        survivors = outcome.survivors
        wait_for(lambda: all((out / f"error_{r}.json").exists() for r in survivors), detect_limit,
                  [job])
        wait_for(lambda: not any(alive(pids[r]) for r in survivors), exit_limit, None)
        outcome.stuck = [r for r in survivors if alive(pids[r])]
    finally:
        _stop_mpi(job, pids, victim)
    outcome.launcher_exit = job.returncode
    outcome.exit_codes = {rank: None for rank in range(world_size)}
    return _collect(outcome, out, pids)


def _stop_mpi(job, pids: list, victim: int) -> None:
    """Kill the victim, give mpiexec a moment to end the job, then kill whatever is left (the
    ranks run in sessions of their own)."""
    if victim < len(pids) and alive(pids[victim]):
        os.kill(pids[victim], signal.SIGKILL)
    try:
        job.wait(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(timeout=10)
    for pid in pids:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)
    wait_for(lambda: not any(alive(pid) for pid in pids), 10.0, None)


def _inject(fault: str, victim, out: Path) -> float:
    if fault == "stop_early":  # done already, by the victim itself
        return json.loads((out / "injected.json").read_text())["time"]
    if fault == "close_socket" or fault in OWN_FAULTS:
        (out / ("close_socket" if fault == "close_socket" else "fault_now")).touch()
        if not wait_for(lambda: (out / "injected.json").exists(), 10.0, None):
            raise RuntimeError(f"the victim did not bring about {fault!r}")
        return json.loads((out / "injected.json").read_text())["time"]
    injected = time.time()
    os.kill(victim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    return injected


def _stop_all(procs, victim: Optional[int]) -> None:
    """Let every rank but a killed or stopped ``victim`` exit on its own briefly (the survivors
    of a stopped rank must not need it to leave), then kill what is left, the victim too."""
    deadline = time.monotonic() + 15.0
    for proc in (p for rank, p in enumerate(procs) if rank != victim):
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


def _logs(out: Path, world_size: int) -> str:
    parts = []
    for name in [f"rank {rank}" for rank in range(world_size)] + ["mpiexec"]:
        path = out / f"{name.replace(' ', '')}.log"
        if path.exists():
            parts.append(f"--- {name} ---\n" + path.read_text(errors="replace")[-3000:])
    return "\n".join(parts)
