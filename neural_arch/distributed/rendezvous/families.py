"""The launchers' variable families: which variables tell a process its rank, world size and
place on its host, read one family at a time, each value with the variable that gave it.

A family is what one kind of launcher sets: torchrun and our launcher (RANK, WORLD_SIZE, ...),
Horovod (HOROVOD_*), Open MPI (OMPI_COMM_WORLD_*), MPICH and Intel MPI (PMI_*), SLURM's srun
(SLURM_*), a Kubernetes indexed job (JOB_COMPLETION_INDEX), torchrun's own inputs as Kubeflow
sets them (PET_*), and PMIx (PMIX_RANK, which names a rank but no world size). ``env.resolve``
decides which family speaks for the process and checks the others against it.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, Mapping, Optional

# Most specific first: a launcher nested inside another sets its own family, and the outer one's
# variables, inherited, describe the outer launcher's processes, not this one.
ORDER = ("env", "horovod", "mpi", "pmi", "slurm", "k8s", "pet", "pmix")
TITLES = {
    "env": "torchrun / neural_arch launcher", "horovod": "Horovod", "mpi": "Open MPI",
    "pmi": "MPICH / Intel MPI (PMI)", "slurm": "SLURM (srun)",
    "k8s": "Kubernetes indexed job", "pet": "torchrun inputs (PET_*, Kubeflow)", "pmix": "PMIx",
}
# Set by a launcher that made RANK/WORLD_SIZE itself (ours and torchrun): variables of other
# families then belong to whatever started that launcher.
LAUNCHER_MARKERS = ("GROUP_RANK", "TORCHELASTIC_RUN_ID")


def read_int(environ: Mapping[str, str], name: Optional[str]) -> Optional[int]:
    raw = environ.get(name) if name else None
    if raw is None or raw.strip() == "":
        return None
    try:
        return int(raw.strip())
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


@dataclass
class Reading:
    """One family's word on this process; ``names`` maps each field to the variable read (or
    that would have been read), ``sources`` to ``VAR=value`` for the fields it gave."""
    family: str
    rank: Optional[int] = None
    size: Optional[int] = None
    local: Optional[int] = None
    local_size: Optional[int] = None
    names: Dict[str, str] = field(default_factory=dict)
    sources: Dict[str, str] = field(default_factory=dict)

    def take(self, environ: Mapping[str, str], what: str, *candidates: Optional[str]) -> None:
        """Set field ``what`` from the first of ``candidates`` that is set."""
        names = [c for c in candidates if c]
        if names:
            self.names.setdefault(what, names[0])
        for name in names:
            value = read_int(environ, name)
            if value is not None:
                setattr(self, what, value)
                self.names[what] = name
                self.sources[what] = f"{name}={value}"
                return

    def describe(self, what: str) -> str:
        return self.sources.get(what) or f"{self.names.get(what, what)} (not set)"


_SIMPLE = {
    "env": ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),
    "horovod": ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE"),
    "mpi": ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
            "OMPI_COMM_WORLD_LOCAL_SIZE"),
    "pmi": ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),
}
_RANK_VAR = {**{f: names[0] for f, names in _SIMPLE.items()}, "slurm": "SLURM_PROCID",
             "k8s": "JOB_COMPLETION_INDEX", "pet": "PET_NODE_RANK", "pmix": "PMIX_RANK"}


def present(environ: Mapping[str, str]) -> list[str]:
    """The families whose rank variable is set, most specific first."""
    return [f for f in ORDER if environ.get(_RANK_VAR[f], "").strip()]


def read(family: str, environ: Mapping[str, str], lone_size: Optional[int]) -> Reading:
    """What ``family`` says; ``lone_size`` is a WORLD_SIZE set without RANK, the world size of
    the families that name none themselves (a Kubernetes index, PMIx)."""
    r = Reading(family)
    if family in _SIMPLE:
        rank, size, local, local_size = _SIMPLE[family]
        for what, name in (("rank", rank), ("size", size), ("local", local),
                           ("local_size", local_size)):
            r.take(environ, what, name)
        if family == "horovod":
            _check_cross(environ)
    elif family == "slurm":
        r.take(environ, "rank", "SLURM_PROCID")
        r.take(environ, "size", "SLURM_NTASKS", "SLURM_NPROCS")
        r.take(environ, "local", "SLURM_LOCALID")
        r.names["local_size"] = "SLURM_TASKS_PER_NODE"
        spec_name, local_size = _slurm_local_world_size(environ)
        if local_size is not None:
            r.local_size = local_size
            r.sources["local_size"] = f"{spec_name}={environ[spec_name]} (this node's count)"
    else:
        r.take(environ, "rank", _RANK_VAR[family])
        if family == "pet":
            _single_process_per_node(environ, "PET_NODE_RANK")
            r.take(environ, "size", "PET_NNODES")
        elif family == "k8s":
            _single_process_per_node(environ, "JOB_COMPLETION_INDEX")
            if lone_size is None:  # else WORLD_SIZE, below
                r.take(environ, "size", "PET_NNODES")
                if r.size is None:
                    r.names["size"] = "WORLD_SIZE (or PET_NNODES)"
        else:
            r.names["size"] = "WORLD_SIZE"
        if lone_size is not None and r.size is None:
            r.size, r.sources["size"] = lone_size, f"WORLD_SIZE={lone_size}"
            r.names["size"] = "WORLD_SIZE"
        r.names.setdefault("local", "LOCAL_RANK")
        r.names.setdefault("local_size", "LOCAL_WORLD_SIZE")
        r.take(environ, "local", "LOCAL_RANK")
        if family in ("pet", "k8s") and r.local is None:
            # one process per node (pod): checked above
            r.local, r.local_size = 0, 1
            r.sources["local"] = r.sources["local_size"] = "one process per pod"
    return r


def _single_process_per_node(environ: Mapping[str, str], rank_var: str) -> None:
    """A pod index or a node rank is a process's rank only with one process per node; with
    more, torchrun (or our launcher, which reads PET_*) should have started them."""
    nproc = environ.get("PET_NPROC_PER_NODE", "").strip()
    if nproc and nproc != "1":
        raise ValueError(f"PET_NPROC_PER_NODE={nproc} asks for {nproc} processes on this node "
                         f"but RANK is not set, so {rank_var}={environ[rank_var]} numbers a node, "
                         f"not a process: start them with python -m "
                         f"neural_arch.distributed.launcher (it reads PET_*) or torchrun")
    nnodes = environ.get("PET_NNODES", "").strip()
    if nnodes and not nnodes.isdigit():
        raise ValueError(f"PET_NNODES={nnodes!r} is not a number of nodes (an elastic range "
                         f"needs an elastic launcher); set it to one integer")


def _check_cross(environ: Mapping[str, str]) -> None:
    cross, cross_size = (read_int(environ, n) for n in ("HOROVOD_CROSS_RANK",
                                                         "HOROVOD_CROSS_SIZE"))
    if cross is not None and cross_size is not None and not 0 <= cross < cross_size:
        raise ValueError(f"HOROVOD_CROSS_RANK={cross} is outside [0, "
                         f"HOROVOD_CROSS_SIZE={cross_size})")


def _slurm_local_world_size(environ: Mapping[str, str]) -> tuple[str, Optional[int]]:
    """Tasks on this node from SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE ("2(x3),1")."""
    name = next((n for n in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
                 if environ.get(n)), "SLURM_TASKS_PER_NODE")
    spec = environ.get(name)
    node = read_int(environ, "SLURM_NODEID") or 0
    if not spec:
        return name, None
    counts: list[int] = []
    for part in spec.split(","):
        match = re.fullmatch(r"\s*(\d+)(?:\(x(\d+)\))?\s*", part)
        if match is None:
            return name, None
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return name, (counts[node] if node < len(counts) else None)


def is_job_step(family: str, environ: Mapping[str, str]) -> bool:
    """Whether ``family``'s variables were set for this very process. srun sets SLURM_STEP_ID
    for the tasks it starts; a batch script (and whatever it starts by hand, mpirun included)
    only inherits SLURM_PROCID=0 and the allocation's SLURM_NTASKS."""
    return family != "slurm" or bool(environ.get("SLURM_STEP_ID", "").strip())
