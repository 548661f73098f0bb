"""Who am I in this job? Read rank, world size and the master's address from the environment.

``env://`` looks for the launcher's variables in this order: our own and PyTorch's
(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Open MPI's (OMPI_COMM_WORLD_*), MPICH/Intel
MPI's (PMI_*, MPI_LOCALRANKID), then SLURM's (SLURM_PROCID, ...). With none of them, the process
is a job of one. ``tcp://host:port`` names the master explicitly.

As with torch.distributed, a half-set ``env://`` contract is an error, not a job of one:
RANK without WORLD_SIZE, WORLD_SIZE without RANK, and (WORLD_SIZE > 1, a store to meet at)
RANK and WORLD_SIZE without MASTER_ADDR and MASTER_PORT. A job of one that kept running while
its siblings waited would train alone and look healthy.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Mapping, Optional
from urllib.parse import urlsplit

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500

# launcher -> (rank, world size, local rank, local world size) variable names
_LAUNCHERS = (
    ("env", ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")),
    ("mpi", ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
             "OMPI_COMM_WORLD_LOCAL_SIZE")),
    ("pmi", ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS")),
    ("slurm", ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", None)),
)
_MPI_MARKERS = ("OMPI_COMM_WORLD_SIZE", "PMI_RANK", "PMI_SIZE", "PMIX_RANK")
# What backend="auto" defers to; the second name is the one older scripts and job files use.
BACKEND_VAR, BACKEND_ALIAS = "NEURAL_ARCH_BACKEND", "NEURAL_FORGE_BACKEND"


@dataclass(frozen=True)
class RendezvousInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    launcher: str  # "env" | "mpi" | "slurm" | "pmi" | "explicit"


def is_launched_by_mpi(environ: Optional[Mapping[str, str]] = None) -> bool:
    """True when mpirun/mpiexec (Open MPI, MPICH, Intel MPI) or srun with PMI started us."""
    environ = os.environ if environ is None else environ
    return any(name in environ for name in _MPI_MARKERS)


def backend_from_environment(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """NEURAL_ARCH_BACKEND, or its alias NEURAL_FORGE_BACKEND; None when neither is set."""
    environ = os.environ if environ is None else environ
    main, alias = (environ.get(name, "").strip() for name in (BACKEND_VAR, BACKEND_ALIAS))
    if main and alias and main.lower() != alias.lower():
        raise ValueError(f"{BACKEND_VAR}={main!r} and its alias {BACKEND_ALIAS}={alias!r} "
                         f"disagree; set only one of them")
    return main or alias or None


def _int(environ: Mapping[str, str], name: str) -> Optional[int]:
    raw = environ.get(name)
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand SLURM host lists: ``"node[01-03,07],gpu5"`` -> node01 node02 node03 node07 gpu5."""
    hosts: list[str] = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist):
        hosts.extend(_expand_brackets(item.strip()))
    return [h for h in hosts if h]


def _expand_brackets(item: str) -> list[str]:
    match = re.search(r"\[([^\]]*)\]", item)
    if match is None:
        return [item]
    head, tail = item[:match.start()], item[match.end():]
    out = []
    for part in match.group(1).split(","):
        lo, _, hi = part.strip().partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()):
            raise ValueError(f"cannot expand SLURM node list entry {item!r} (range {part!r})")
        for n in range(int(lo), int(hi or lo) + 1):
            out.extend(head + str(n).zfill(len(lo)) + rest for rest in _expand_brackets(tail))
    return out


def _slurm_local_world_size(environ: Mapping[str, str]) -> Optional[int]:
    """Tasks on this node from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1")."""
    spec = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    node = _int(environ, "SLURM_NODEID") or 0
    if not spec:
        return None
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return None
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts[node] if node < len(counts) else None


def _from_launcher(environ: Mapping[str, str]):
    # A lone WORLD_SIZE does not make the "env" family: under mpirun or srun the MPI or SLURM
    # variables still say who is who (and must agree with it); with no launcher, it is half a
    # contract, and resolve() names the RANK it lacks.
    lone_size = _int(environ, "WORLD_SIZE") if _int(environ, "RANK") is None else None
    for launcher, (rank_var, size_var, local_var, local_size_var) in _LAUNCHERS:
        rank = _int(environ, rank_var)
        if rank is None:
            continue
        size = _int(environ, size_var)
        if size is None and launcher == "slurm":
            size = _int(environ, "SLURM_NPROCS")
        if lone_size is not None and size is not None and lone_size != size:
            raise ValueError(f"WORLD_SIZE={lone_size} disagrees with {size_var}={size} and RANK "
                             f"is not set; unset WORLD_SIZE or set RANK too")
        local = _int(environ, local_var)
        local_size = (_int(environ, local_size_var) if local_size_var
                      else _slurm_local_world_size(environ))
        names = (rank_var, size_var, local_var, local_size_var or "SLURM_TASKS_PER_NODE")
        return launcher, rank, size, local, local_size, names
    if lone_size is not None:
        return ("env", None, lone_size, _int(environ, "LOCAL_RANK"),
                _int(environ, "LOCAL_WORLD_SIZE"), _LAUNCHERS[0][1])
    return None


def _parse_tcp(init_method: str) -> tuple[str, int]:
    parts = urlsplit(init_method)
    try:
        host, port = parts.hostname, parts.port
    except ValueError:
        raise ValueError(f"init_method {init_method!r} has an invalid port") from None
    if not host or port is None:
        raise ValueError(f"init_method {init_method!r} must look like tcp://host:port")
    return host, port


def resolve(init_method: str = "env://", world_size: Optional[int] = None,
            rank: Optional[int] = None, environ: Optional[Mapping[str, str]] = None, *,
            master_needed: bool = True) -> RendezvousInfo:
    """Work out this process's place in the job; explicit arguments override the environment.

    ``master_needed=False`` (a store was passed in, or the backend needs none) lets an
    ``env://`` job of several ranks go without MASTER_ADDR and MASTER_PORT.
    """
    environ = os.environ if environ is None else environ
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{name} must be an int or None, got {value!r}")
    found = _from_launcher(environ)
    launcher, env_rank, env_size, local, local_size, names = found or (
        "env", None, None, None, None, _LAUNCHERS[0][1])
    if rank is not None:
        launcher = "explicit"
    elif found is None and world_size is not None:
        launcher = "explicit"
    rank_name = "rank" if rank is not None else names[0]
    size_name = "world_size" if world_size is not None else names[1]
    size_from_env = world_size is None and env_size is not None
    rank = env_rank if rank is None else rank
    world_size = env_size if world_size is None else world_size
    if world_size is None:
        if rank is not None:
            hint = ("pass world_size=" if rank_name == "rank"
                    else f"unset {rank_name} for a job of one")
            raise ValueError(f"{rank_name}={rank} is set but {names[1]} is not: set "
                             f"{names[1]} too, or {hint}")
        world_size = 1
    if world_size < 1:
        raise ValueError(f"{size_name} must be >= 1, got {world_size}")
    if rank is None and (world_size != 1 or size_from_env):
        raise ValueError(f"{size_name}={world_size} but no rank: set {names[0]} "
                         f"(0..{world_size - 1}) on each process or pass rank=")
    rank = 0 if rank is None else rank
    if not 0 <= rank < world_size:
        raise ValueError(f"{rank_name}={rank} is outside [0, {size_name}={world_size})")
    # Without a launcher's word, assume every rank runs on this host (or blocks of local_size).
    if local_size is None:
        local_size = world_size if local is None else max(world_size, local + 1)
    if local is None:
        local = rank % local_size
    if not 0 <= local < local_size:
        raise ValueError(f"{names[2]}={local} is outside [0, {names[3]}={local_size})")
    if launcher == "env" and world_size > 1 and master_needed and init_method == "env://":
        _require_master(environ, rank, world_size)
    addr, port = _master(init_method, environ, launcher)
    return RendezvousInfo(rank, world_size, local, local_size, addr, port, launcher)


def _require_master(environ: Mapping[str, str], rank: int, world_size: int) -> None:
    """RANK and WORLD_SIZE came from the environment: the master's address must come too,
    since a guessed 127.0.0.1 leaves ranks on other hosts waiting for a store never served."""
    missing = [n for n in ("MASTER_ADDR", "MASTER_PORT") if not environ.get(n, "").strip()]
    if missing:
        raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                         f"set for rank {rank} of {world_size} (from RANK/WORLD_SIZE): env:// "
                         f"needs the host and port of rank 0's store, as torch.distributed "
                         f"does (on one machine, e.g. MASTER_ADDR=127.0.0.1 "
                         f"MASTER_PORT={DEFAULT_MASTER_PORT})")


def _master(init_method: str, environ: Mapping[str, str], launcher: str) -> tuple[str, int]:
    if init_method.startswith("tcp://"):
        return _parse_tcp(init_method)
    if init_method != "env://":
        raise ValueError(f"init_method must be 'env://' or 'tcp://host:port', got {init_method!r}")
    addr = environ.get("MASTER_ADDR", "").strip()
    if not addr:
        nodelist = environ.get("SLURM_STEP_NODELIST") or environ.get("SLURM_NODELIST")
        hosts = expand_nodelist(nodelist) if nodelist and launcher in ("slurm", "explicit") else []
        addr = hosts[0] if hosts else DEFAULT_MASTER_ADDR
    port = _int(environ, "MASTER_PORT")
    port = DEFAULT_MASTER_PORT if port is None else port
    if not 1 <= port <= 65535:
        raise ValueError(f"MASTER_PORT={port} is outside [1, 65535]")
    return addr, port
