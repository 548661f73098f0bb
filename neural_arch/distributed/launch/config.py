"""One launcher run as data: the validated ``LaunchConfig`` and the environment of its workers.

Every value is checked as the config is built, so a bad option fails before any worker starts.
``DistributedLauncher`` builds one from the command line (``args``) or from the
arguments of ``launch_distributed_training``.
"""
from __future__ import annotations

import os
import secrets
import shlex
import sys
from dataclasses import dataclass
from shutil import which
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from ..rendezvous.secret import check_secret
from ..rendezvous.env import BACKEND_ALIAS
from ..rendezvous.job import RUN_ID_VAR

BACKENDS = ("auto", "shm", "tcp", "mpi", "gloo", "nccl")
SECRET_VAR = "NEURAL_ARCH_SECRET"
# "1" when the launcher's own stderr is a terminal: the workers' stderr is a pipe to the
# launcher, which passes carriage-return redraws on as they come, so a progress bar can draw.
CONSOLE_TTY_VAR = "NEURAL_ARCH_CONSOLE_TTY"
# Variables by which an MPI launcher tells a process its rank. A launcher itself started by
# mpirun/srun must not pass them on: its workers are not those MPI ranks, and backend "auto"
# would pick MPI for them.
_MPI_RANK_PREFIXES = ("OMPI_COMM_WORLD_", "PMI_", "PMIX_RANK", "MPI_LOCALRANKID",
                      "MPI_LOCALNRANKS")

Target = Union[str, os.PathLike, Callable[..., Any]]


def cpu_count() -> int:
    """CPUs this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # platforms without affinity masks
        return os.cpu_count() or 1


def resolve_nproc(value: Union[int, str]) -> int:
    """``--nproc_per_node`` value: a positive int, or ``auto``/``cpu`` for the CPU count."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("auto", "cpu"):
            return cpu_count()
        try:
            value = int(text)
        except ValueError:
            raise ValueError(f"nproc_per_node must be a positive integer or 'auto', "
                             f"got {value!r}") from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"nproc_per_node must be a positive integer or 'auto', got {value!r}")
    return value


def _int_at_least(name: str, value: Any, low: int, high: Optional[int] = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r} ({type(value).__name__})")
    if value < low or (high is not None and value > high):
        bounds = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be {bounds}, got {value}")
    return value


@dataclass
class LaunchConfig:
    """Everything one launcher run needs; validated on construction."""

    target: Target
    nproc_per_node: Union[int, str] = 1
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: int = 29500
    backend: str = "auto"
    script_args: Sequence[Any] = ()
    max_restarts: int = 0
    log_dir: Optional[Union[str, os.PathLike]] = None
    env: Optional[Mapping[str, str]] = None
    run_module: bool = False
    no_python: bool = False
    standalone: bool = False
    monitor_interval: float = 0.1
    timeout: Optional[float] = None
    prefix_output: bool = True
    grace_period: float = 5.0

    def __post_init__(self) -> None:
        self.nproc_per_node = resolve_nproc(self.nproc_per_node)
        _int_at_least("nnodes", self.nnodes, 1)
        _int_at_least("node_rank", self.node_rank, 0)
        if self.node_rank >= self.nnodes:
            raise ValueError(f"node_rank must be < nnodes, got node_rank={self.node_rank} "
                             f"with nnodes={self.nnodes}")
        if self.standalone and self.nnodes != 1:
            raise ValueError(f"standalone runs on one node, got nnodes={self.nnodes}")
        _int_at_least("master_port", self.master_port, 1, 65535)
        _int_at_least("max_restarts", self.max_restarts, 0)
        if not isinstance(self.master_addr, str) or not self.master_addr.strip():
            raise ValueError(f"master_addr must be a host name or address, "
                             f"got {self.master_addr!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        for name in ("monitor_interval", "grace_period", "timeout"):
            value = getattr(self, name)
            if value is None and name == "timeout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise TypeError(f"{name} must be a number of seconds, got {value!r}")
            if not value > 0:
                raise ValueError(f"{name} must be > 0 seconds, got {value!r}")
        if self.env is not None:
            bad = {k: v for k, v in self.env.items()
                   if not isinstance(k, str) or not isinstance(v, str)}
            if bad:
                raise TypeError(f"env must map str to str, got {bad!r}")
        given_secret = self.base_environment().get(SECRET_VAR)
        if given_secret:  # refused here rather than by every worker after it started
            check_secret(given_secret.encode(), SECRET_VAR)
        self._check_target()
        if self.backend == "mpi":
            raise ValueError(self._mpi_refusal())

    def _mpi_refusal(self) -> str:
        """Why backend 'mpi' is refused here, and the mpirun command that runs the same job.

        MPI ranks must be started by MPI's own launcher: processes started here would each be
        an MPI world of one, and fail to join a job of world_size ranks.
        """
        mpirun = next((name for name in ("mpirun", "mpiexec") if which(name)), None)
        beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
        if mpirun is None and os.access(beside, os.X_OK):
            mpirun = beside  # a venv's Open MPI sits next to its Python, often off PATH
        if callable(self.target):
            program = ["python", "your_script.py"]
        elif self.no_python:
            program = [self.target, *self.script_args]
        else:
            program = [sys.executable, *(["-m"] if self.run_module else []), self.target,
                       *self.script_args]
        command = shlex.join([mpirun or "mpirun", "-n", str(self.world_size), *program])
        return (f"backend 'mpi' needs ranks started by MPI; this launcher starts plain "
                f"processes, each of which would be an MPI job of one. Run the job with mpirun "
                f"(or mpiexec; srun under SLURM) instead: {command} (add --oversubscribe "
                f"for more ranks than cores)")

    def _check_target(self) -> None:
        if callable(self.target):
            if self.run_module or self.no_python:
                raise ValueError("run_module/no_python apply to scripts, not to a callable target")
            return
        if not isinstance(self.target, (str, os.PathLike)) or not os.fspath(self.target):
            raise TypeError(f"target must be a script path, a module name or a callable, "
                            f"got {self.target!r}")
        self.target = os.fspath(self.target)
        self.script_args = [str(arg) for arg in self.script_args]
        if self.run_module and self.no_python:
            raise ValueError("-m/--module and --no_python exclude each other")
        if self.run_module:
            return
        if self.no_python:
            if os.path.isfile(self.target) or which(self.target):
                return
            raise ValueError(f"program not found: {self.target!r}")
        if not os.path.isfile(self.target):
            raise ValueError(f"script not found: {self.target!r} "
                             f"(looked in {os.path.abspath(self.target)!r})")

    @property
    def world_size(self) -> int:
        return self.nnodes * int(self.nproc_per_node)

    def base_environment(self) -> Dict[str, str]:
        """The launcher's environment with the caller's ``env`` additions on top."""
        base = dict(os.environ)
        base.update(self.env or {})
        return base

    def job_environment(self) -> Tuple[Dict[str, str], List[str]]:
        """Environment shared by all workers of the job, and notes for the user about it."""
        base, notes = self.base_environment(), []
        for name in [n for n in base if n.startswith(_MPI_RANK_PREFIXES)]:
            del base[name]
        # The workers get the launcher's backend as NEURAL_ARCH_BACKEND; an alias left set to
        # another value would contradict it.
        base.pop(BACKEND_ALIAS, None)
        if self.nnodes == 1 and not base.get(RUN_ID_VAR):
            # The job's identity (``rendezvous.job``): a rank of another job that reaches this
            # job's store is told whose it is. Several nodes would each make up another one.
            base[RUN_ID_VAR] = secrets.token_hex(6)
        if not base.get(SECRET_VAR):
            if self.nnodes == 1:
                base[SECRET_VAR] = secrets.token_hex(32)
            else:
                # A secret made up here would differ on every node and the ranks would reject
                # each other; the per-user cookie file at least works with a shared home.
                notes.append(f"{SECRET_VAR} is not set: workers fall back to the per-user secret "
                             f"file, which must be the same on every node; better set "
                             f"{SECRET_VAR} to one value on all {self.nnodes} nodes")
        base["PYTHONUNBUFFERED"] = "1"
        if _stderr_is_terminal():
            base[CONSOLE_TTY_VAR] = "1"
        else:
            base.pop(CONSOLE_TTY_VAR, None)  # a nested launcher's output goes to a pipe
        if int(self.nproc_per_node) > 1 and "OMP_NUM_THREADS" not in base:
            base["OMP_NUM_THREADS"] = "1"
            notes.append("setting OMP_NUM_THREADS=1 for each worker so they do not oversubscribe "
                         "the CPUs; set it yourself to tune")
        return base, notes

    def worker_environment(self, job_env: Mapping[str, str], local_rank: int,
                           restart_count: int) -> Dict[str, str]:
        """The full environment contract of one worker."""
        env = dict(job_env)
        env.update(
            RANK=str(self.node_rank * int(self.nproc_per_node) + local_rank),
            LOCAL_RANK=str(local_rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_WORLD_SIZE=str(self.nproc_per_node),
            GROUP_RANK=str(self.node_rank),
            NODE_RANK=str(self.node_rank),
            MASTER_ADDR=self.master_addr,
            MASTER_PORT=str(self.master_port),
            NEURAL_ARCH_BACKEND=self.backend,
            RESTART_COUNT=str(restart_count),
        )
        return env


def _stderr_is_terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # replaced or closed stderr
        return False
