"""Who am I in this job? Read rank, world size and the master's address from the environment.

``env://`` asks the launchers' variable families (``families``), most specific first: ours and
torchrun's (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE), Horovod's (HOROVOD_*), Open MPI's
(OMPI_COMM_WORLD_*), MPICH/Intel MPI's (PMI_*), SLURM's (SLURM_PROCID, ...), a Kubernetes
indexed job's (JOB_COMPLETION_INDEX), torchrun's inputs (PET_NODE_RANK, PET_NNODES) and PMIx's
(PMIX_RANK). The first one set decides; every other one that describes the same process must
agree with it, or the job would be put together from two launchers' ideas of it. With none of
them, the process is a job of one. ``tcp://host:port`` names the master explicitly. The master
is MASTER_ADDR/MASTER_PORT (or torchrun's PET_MASTER_*); srun jobs without them meet on their
first node at a port derived from their job id, so two jobs on one node do not collide.
``python -m neural_arch.distributed.env`` prints what was chosen and why.

As with torch.distributed, a half-set ``env://`` contract is an error, not a job of one:
RANK without WORLD_SIZE, WORLD_SIZE without RANK, and (WORLD_SIZE > 1, a store to meet at)
RANK and WORLD_SIZE without MASTER_ADDR and MASTER_PORT, and so is a SLURM task of several
without a node list or MASTER_ADDR (``hostlist`` reads the node list; a malformed one is an
error too). A job of one that kept running while its siblings waited would train alone and
look healthy.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional
from urllib.parse import urlsplit

from .families import (LAUNCHER_MARKERS, TITLES, Reading, is_job_step, present, read,
                       read_int)
from .hostlist import expand_nodelist, first_host  # noqa: F401 (expand_nodelist: for callers)

DEFAULT_MASTER_ADDR = "127.0.0.1"
DEFAULT_MASTER_PORT = 29500
SLURM_PORT_BASE, SLURM_PORT_SPAN = 15000, 17000

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
    # the family that decided: "env" | "horovod" | "mpi" | "pmi" | "slurm" | "k8s" | "pet" |
    # "pmix", or "explicit" when the caller passed the rank
    launcher: str
    # what decided each field ("RANK=1", "default: ..."); not part of the value
    sources: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)


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
    ``env://`` job of several ranks go without MASTER_ADDR and MASTER_PORT. The result's
    ``sources`` say which variable (or argument, or default) decided each value.
    """
    environ = os.environ if environ is None else environ
    for name, value in (("rank", rank), ("world_size", world_size)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise TypeError(f"{name} must be an int or None, got {value!r}")
    found = _from_launcher(environ)
    launcher = found.family
    if rank is not None or (found.rank is None and found.size is None and world_size is not None):
        launcher = "explicit"
    names = found.names
    rank_name = "rank" if rank is not None else names["rank"]
    size_name = "world_size" if world_size is not None else names["size"]
    size_from_env = world_size is None and found.size is not None
    sources = {"rank": "rank= argument" if rank is not None else found.sources.get("rank"),
               "world_size": ("world_size= argument" if world_size is not None
                              else found.sources.get("size"))}
    rank = found.rank if rank is None else rank
    world_size = found.size if world_size is None else world_size
    if world_size is None:
        if rank is not None:
            hint = ("pass world_size=" if rank_name == "rank"
                    else f"unset {rank_name} for a job of one")
            raise ValueError(f"{rank_name}={rank} is set but {names['size']} is not: set "
                             f"{names['size']} too, or {hint}")
        world_size = 1
    if world_size < 1:
        raise ValueError(f"{size_name} must be >= 1, got {world_size}")
    if rank is None and (world_size != 1 or size_from_env):
        raise ValueError(f"{size_name}={world_size} but no rank: set {names['rank']} "
                         f"(0..{world_size - 1}) on each process or pass rank=")
    rank = 0 if rank is None else rank
    if not 0 <= rank < world_size:
        raise ValueError(f"{rank_name}={rank} is outside [0, {size_name}={world_size})")
    local, local_size = found.local, found.local_size
    sources["local_rank"] = found.sources.get("local")
    sources["local_world_size"] = found.sources.get("local_size")
    # Without a launcher's word, assume every rank runs on this host (or blocks of local_size).
    if local_size is None:
        local_size = world_size if local is None else max(world_size, local + 1)
        sources["local_world_size"] = "default: every rank on this host"
    if local is None:
        local = rank % local_size
        sources["local_rank"] = f"default: rank {rank} mod local world size {local_size}"
    if not 0 <= local < local_size:
        raise ValueError(f"{names['local']}={local} is outside [0, {names['local_size']}="
                         f"{local_size})")
    if world_size > 1 and master_needed and init_method == "env://":
        if launcher in ("env", "k8s", "pet"):
            _require_master(environ, rank, world_size, found)
        elif launcher == "slurm":
            _require_slurm_master(environ, rank, world_size, found)
    (addr, addr_from), (port, port_from) = _master(init_method, environ, launcher)
    sources.update(master_addr=addr_from, master_port=port_from)
    if sources["rank"] is None:
        sources["rank"] = "default: no rank variable is set (a job of one)"
    if sources["world_size"] is None:
        sources["world_size"] = "default: no world size variable is set (a job of one)"
    return RendezvousInfo(rank, world_size, local, local_size, addr, port, launcher, sources)


def _from_launcher(environ: Mapping[str, str]) -> Reading:
    """The family that speaks for this process, checked against the others that are set."""
    # A lone WORLD_SIZE does not make the "env" family: under mpirun or srun the MPI or SLURM
    # variables still say who is who (and must agree with it); with no launcher, it is half a
    # contract, and resolve() names the RANK it lacks.
    lone_size = read_int(environ, "WORLD_SIZE") if read_int(environ, "RANK") is None else None
    families = present(environ)
    if not families:
        found = read("env", environ, None)
        return found
    found = read(families[0], environ, lone_size)
    if lone_size is not None and found.size is not None and lone_size != found.size:
        raise ValueError(f"WORLD_SIZE={lone_size} disagrees with {found.names['size']}="
                         f"{found.size} and RANK is not set; unset WORLD_SIZE or set RANK too")
    if found.rank is not None and found.size is not None:
        _check_agreement(found, families[1:], environ, lone_size)
    return found


def _check_agreement(found: Reading, others: list[str], environ: Mapping[str, str],
                     lone_size: Optional[int]) -> None:
    """Two launchers that both claim this process must agree on it: a rank taken from one
    while the other set up the job would join the wrong world, or the right one twice."""
    if found.family == "env" and any(environ.get(m, "").strip() for m in LAUNCHER_MARKERS):
        return  # a launcher made RANK/WORLD_SIZE; the outer variables describe that launcher
    for family in others:
        if not is_job_step(family, environ):
            continue
        if family == "pmix" and found.family not in ("mpi", "pmi", "slurm"):
            continue  # PMIx numbers the ranks of the MPI or srun job it serves, nobody else's
        try:
            other = read(family, environ, lone_size)
        except ValueError:
            continue  # only the deciding family must be well formed
        if other.rank is None or (other.size is None and family != "pmix"):
            continue
        same_world = other.size is None or other.size == found.size
        if same_world and other.rank != found.rank:
            sizes = ", ".join(r.describe("size") for r in (found, other) if r.size is not None)
            raise ValueError(
                f"{found.describe('rank')} contradicts {other.describe('rank')} in the same "
                f"world ({sizes}): {TITLES[found.family]} and {TITLES[family]} disagree about "
                f"which rank this process is; unset the variables of the one that did not "
                f"start it")
        if not same_world and found.family == "env":
            raise ValueError(
                f"{found.describe('size')} contradicts {other.describe('size')} "
                f"({found.describe('rank')}, {other.describe('rank')}): both describe this "
                f"process, as no launcher set GROUP_RANK, so the job cannot have both sizes; "
                f"make WORLD_SIZE match, or unset RANK/WORLD_SIZE and let "
                f"{TITLES[family]} decide")


def _require_master(environ: Mapping[str, str], rank: int, world_size: int,
                    found: Reading) -> None:
    """RANK and WORLD_SIZE came from the environment: the master's address must come too,
    since a guessed 127.0.0.1 leaves ranks on other hosts waiting for a store never served."""
    missing = [n for n in ("MASTER_ADDR", "MASTER_PORT")
               if not environ.get(n, "").strip() and not environ.get(f"PET_{n}", "").strip()]
    if missing:
        came_from = "/".join(found.names[k] for k in ("rank", "size"))
        raise ValueError(f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not "
                         f"set for rank {rank} of {world_size} (from {came_from}): env:// "
                         f"needs the host and port of rank 0's store, as torch.distributed "
                         f"does (on one machine, e.g. MASTER_ADDR=127.0.0.1 "
                         f"MASTER_PORT={DEFAULT_MASTER_PORT})")


def _node_list(environ: Mapping[str, str]) -> Optional[str]:
    """The SLURM node list variable that names the master's host: the step's, else the job's."""
    return next((n for n in ("SLURM_STEP_NODELIST", "SLURM_NODELIST")
                 if environ.get(n, "").strip()), None)


def _require_slurm_master(environ: Mapping[str, str], rank: int, world_size: int,
                          found: Reading) -> None:
    """srun names the master's host in its node list; without it (nor MASTER_ADDR) each rank
    would take its own host for the master, as a half-set env:// contract would."""
    if any(environ.get(n, "").strip() for n in ("MASTER_ADDR", "PET_MASTER_ADDR")):
        return
    if _node_list(environ) is None:
        raise ValueError(f"rank {rank} of {world_size} (from {found.describe('rank')}, "
                         f"{found.describe('size')}): neither SLURM_STEP_NODELIST nor "
                         f"SLURM_NODELIST (nor MASTER_ADDR) is set to name the host of rank 0's "
                         f"store; run the tasks with srun, which sets them, or set MASTER_ADDR")


def slurm_port(environ: Mapping[str, str]) -> Optional[int]:
    """A port of the SLURM job's own, for srun jobs that set no MASTER_PORT: every task of a
    step computes the same one, and two jobs (or two steps of one job) on a node get different
    ones unless their ids are SLURM_PORT_SPAN apart. The range stays below Linux's ephemeral
    ports (32768 and up), where outgoing connections would take them."""
    job = environ.get("SLURM_JOB_ID", "").strip()
    if not job.isdigit():
        return None
    step = environ.get("SLURM_STEP_ID", "").strip()
    step_number = int(step) if step.isdigit() else 0
    return SLURM_PORT_BASE + (int(job) + 1009 * step_number) % SLURM_PORT_SPAN


def _master(init_method: str, environ: Mapping[str, str],
            launcher: str) -> tuple[tuple[str, str], tuple[int, str]]:
    """((address, where it came from), (port, where it came from))."""
    if init_method.startswith("tcp://"):
        host, port = _parse_tcp(init_method)
        return (host, f"init_method={init_method}"), (port, f"init_method={init_method}")
    if init_method != "env://":
        raise ValueError(f"init_method must be 'env://' or 'tcp://host:port', got {init_method!r}")
    addr_name = next((n for n in ("MASTER_ADDR", "PET_MASTER_ADDR")
                      if environ.get(n, "").strip()), None)
    if addr_name:
        addr = environ[addr_name].strip()
        addr_from = f"{addr_name}={addr}"
    else:
        list_name = _node_list(environ) if launcher in ("slurm", "explicit") else None
        if list_name:
            addr = first_host(environ[list_name], list_name)
            addr_from = f"{list_name}={environ[list_name]} (its first host)"
        else:
            addr, addr_from = DEFAULT_MASTER_ADDR, "default: this host"
    port_name = next((n for n in ("MASTER_PORT", "PET_MASTER_PORT")
                      if read_int(environ, n) is not None), None)
    derived = slurm_port(environ) if launcher in ("slurm", "explicit") else None
    if port_name:
        port, port_from = read_int(environ, port_name), f"{port_name}={environ[port_name]}"
    elif derived is not None:
        port = derived
        port_from = (f"SLURM_JOB_ID={environ['SLURM_JOB_ID']}"
                     + (f", SLURM_STEP_ID={environ['SLURM_STEP_ID']}"
                        if environ.get("SLURM_STEP_ID") else "")
                     + " (a port of the job's own)")
    else:
        port, port_from = DEFAULT_MASTER_PORT, "default"
    if not 1 <= port <= 65535:
        raise ValueError(f"{port_name or 'MASTER_PORT'}={port} is outside [1, 65535]")
    return (addr, addr_from), (port, port_from)
