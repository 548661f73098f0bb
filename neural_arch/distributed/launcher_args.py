"""Configuration of the launcher: command-line parsing, validation and the workers' environment.

Command-line rule: launcher options (known names, dashes or underscores, ``--opt=value`` or
``--opt value``) are recognised anywhere before a ``--``; everything after ``--`` goes to the
script verbatim, and unknown options after the script go to the script. ``-h`` and ``-m`` are
the launcher's only before the script, so ``train.py -h`` still reaches the script.
"""
from __future__ import annotations

import argparse
import os
import secrets
from dataclasses import dataclass
from shutil import which
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

PROG = "python -m neural_arch.distributed.launcher"
BACKENDS = ("auto", "shm", "tcp", "mpi", "gloo", "nccl")
SECRET_VAR = "NEURAL_ARCH_SECRET"
# Launcher-only before the script: after it these most likely belong to the script.
_BEFORE_SCRIPT_ONLY = {"-h", "--help", "-m", "--module"}
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
        self._check_target()

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


def _canonical(option: str) -> str:
    """``--nproc-per-node=4`` -> ``--nproc_per_node``; single-dash options stay as they are."""
    name = option.split("=", 1)[0]
    if name.startswith("--"):
        return "--" + name[2:].replace("-", "_")
    return name


def build_parser() -> argparse.ArgumentParser:
    """The launcher's options; also the single source of the names the splitter recognises."""
    parser = argparse.ArgumentParser(
        prog=PROG, allow_abbrev=False, formatter_class=argparse.RawDescriptionHelpFormatter,
        usage=f"{PROG} [options] SCRIPT [script args] [options] [-- script args]",
        description="Start nproc_per_node workers on this node with the environment that\n"
                    "init_process_group reads (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
                    "GROUP_RANK, NODE_RANK, MASTER_ADDR, MASTER_PORT, NEURAL_ARCH_BACKEND,\n"
                    f"RESTART_COUNT, {SECRET_VAR}), watch them, and stop all of them when one "
                    "fails.",
        epilog="Options may stand before or after SCRIPT; after SCRIPT the launcher still takes\n"
               "the names above (the script gets the others): put a script option that shares\n"
               "one of these names after '--', which passes the rest to the script verbatim.\n"
               f"{SECRET_VAR}: each job gets a fresh random secret unless it is set in the\n"
               "environment; multi-node jobs must set the same value on every node.\n"
               "Exit status: 0 when every worker exits 0, else the failing worker's code\n"
               "(128+N for a death by signal N), 124 after --timeout.\n")

    def add(name: str, **kwargs: Any) -> None:
        spellings = [name] if "_" not in name else [name, name.replace("_", "-")]
        parser.add_argument(*spellings, dest=name.lstrip("-"), **kwargs)

    add("--nproc_per_node", default="1", metavar="N",
        help="workers on this node: an integer or 'auto' (the CPU count); default 1")
    add("--nnodes", type=int, default=1, metavar="N", help="number of nodes; default 1")
    add("--node_rank", type=int, default=0, metavar="K",
        help="rank of this node, 0..nnodes-1; default 0")
    add("--master_addr", default=os.environ.get("MASTER_ADDR", "127.0.0.1"), metavar="HOST",
        help="address of the node running rank 0; default $MASTER_ADDR or 127.0.0.1")
    add("--master_port", type=int, default=os.environ.get("MASTER_PORT", "29500"), metavar="PORT",
        help="port of rank 0's rendezvous store; default $MASTER_PORT or 29500")
    add("--standalone", action="store_true",
        help="single node on 127.0.0.1 with a free port picked by the launcher")
    add("--backend", default=os.environ.get("NEURAL_ARCH_BACKEND", "auto"), choices=BACKENDS,
        help="passed to the workers as NEURAL_ARCH_BACKEND; default auto")
    add("--max_restarts", type=int, default=0, metavar="N",
        help="restart the whole group up to this many times after a failure; default 0")
    add("--log_dir", default=None, metavar="DIR",
        help="also write each rank's output to DIR/rank_<R>.log")
    add("--monitor_interval", type=float, default=0.1, metavar="SECONDS",
        help="seconds between checks of the workers; default 0.1")
    add("--timeout", type=float, default=None, metavar="SECONDS",
        help="stop all workers and exit 124 after this many seconds")
    add("--no_prefix", action="store_true", help="do not prefix output lines with [rank R]")
    add("--no_python", action="store_true",
        help="run SCRIPT as a program, not with the Python interpreter")
    parser.add_argument("-m", "--module", dest="module", action="store_true",
                        help="SCRIPT is a module name, run as python -m SCRIPT")
    return parser


def _option_table(parser: argparse.ArgumentParser) -> Dict[str, bool]:
    """Canonical option name -> whether it takes a value."""
    table: Dict[str, bool] = {}
    for action in parser._actions:
        for spelling in action.option_strings:
            table[_canonical(spelling)] = action.nargs != 0
    return table


def split_command_line(argv: Sequence[str], parser: argparse.ArgumentParser
                       ) -> Tuple[List[str], Optional[str], List[str]]:
    """Split argv into (launcher tokens for argparse, script, script args)."""
    table = _option_table(parser)
    launcher: List[str] = []
    script: Optional[str] = None
    script_args: List[str] = []
    tokens = list(argv)
    i = 0
    while i < len(tokens):
        token = tokens[i]
        i += 1
        if token == "--":
            rest = tokens[i:]
            if script is None and rest:
                script, rest = rest[0], rest[1:]
            script_args.extend(rest)
            break
        name = _canonical(token) if token.startswith("-") and token != "-" else None
        known = name in table and not (script is not None and name in _BEFORE_SCRIPT_ONLY)
        if known:
            if table[name] and "=" not in token:
                value = tokens[i] if i < len(tokens) and tokens[i] != "--" else None
                if value is None:
                    launcher.append(name)  # argparse reports the missing value
                    continue
                i += 1
                launcher.append(f"{name}={value}")
            else:
                launcher.append(name + token[len(token.split("=", 1)[0]):])
        elif script is not None:
            script_args.append(token)
        elif name is not None:
            launcher.append(token)  # unknown before the script: argparse names it
        else:
            script = token
    return launcher, script, script_args


def parse_launcher_args(argv: Sequence[str]) -> argparse.Namespace:
    """Parse a launcher command line (values are validated by ``LaunchConfig``); exits with
    status 2 and a usage message on a malformed one."""
    parser = build_parser()
    launcher_tokens, script, script_args = split_command_line(argv, parser)
    args = parser.parse_args(launcher_tokens)
    if script is None:
        parser.error("the following arguments are required: SCRIPT")
    args.script, args.script_args, args.parser = script, script_args, parser
    return args
