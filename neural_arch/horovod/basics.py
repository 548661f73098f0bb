"""Joining the job and asking where this process stands in it: ``init``, ``rank``, ``size``...

``init()`` reads the launcher's environment: ours (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE, NODE_RANK, as ``python -m neural_arch.horovod.run`` and
``python -m neural_arch.distributed.launcher`` set them) or Horovod's (HOROVOD_RANK,
HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, HOROVOD_CROSS_RANK, HOROVOD_CROSS_SIZE),
and joins with ``init_process_group``. A process group that already exists is adopted as it
is (and ``shutdown()`` then leaves it to whoever made it).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Mapping, Optional

from .. import distributed as dist

NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclass(frozen=True)
class _Layout:
    rank: int
    size: int
    local_rank: int
    local_size: int
    cross_rank: int
    cross_size: int
    owns_group: bool  # init() made the process group, so shutdown() destroys it


_LAYOUT: Optional[_Layout] = None


def _env_int(environ: Mapping[str, str], *names: str) -> Optional[int]:
    """The first of ``names`` set in the environment, as an int (ValueError naming it)."""
    for name in names:
        raw = environ.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


def init(comm=None, process_sets=None) -> None:
    """Join the job (a second call does nothing, as in Horovod)."""
    global _LAYOUT
    if comm is not None:
        raise NotImplementedError("hvd.init(comm=...): initialising from an MPI communicator is "
                                  "not supported; start the ranks with python -m "
                                  "neural_arch.horovod.run (or mpirun) and call hvd.init()")
    if process_sets is not None:
        raise NotImplementedError("hvd.init(process_sets=...): Horovod process sets are not "
                                  "supported; every operation runs on all ranks")
    if _LAYOUT is not None:
        return
    env = os.environ
    owns = not dist.is_initialized()
    if owns:
        rank = world = None
        if _env_int(env, "RANK") is None and _env_int(env, "HOROVOD_RANK") is not None:
            # Only Horovod's variables: hand them to the rendezvous explicitly.
            rank, world = _env_int(env, "HOROVOD_RANK"), _env_int(env, "HOROVOD_SIZE")
            if world is None:
                raise ValueError(f"HOROVOD_RANK={rank} is set but HOROVOD_SIZE is not; set both "
                                 "(or start the job with python -m neural_arch.horovod.run)")
        dist.init_process_group(rank=rank, world_size=world)
    rank, size = dist.get_rank(), dist.get_world_size()
    local_rank = _env_int(env, "HOROVOD_LOCAL_RANK", "LOCAL_RANK")
    local_size = _env_int(env, "HOROVOD_LOCAL_SIZE", "LOCAL_WORLD_SIZE")
    if local_rank is None or local_size is None:
        # What the rendezvous learnt from the launcher (mpirun's, SLURM's local variables)
        info = dist.get_distributed_info()
        local_rank, local_size = info["local_rank"], info["local_world_size"]
    # Cross = across nodes: this node's index and the number of nodes (every node runs
    # local_size ranks, as our launcher starts them).
    cross_rank = _env_int(env, "HOROVOD_CROSS_RANK", "NODE_RANK", "GROUP_RANK")
    cross_size = _env_int(env, "HOROVOD_CROSS_SIZE")
    if cross_rank is None:
        cross_rank = rank // max(local_size, 1)
    if cross_size is None:
        cross_size = max(size // max(local_size, 1), 1)
    _LAYOUT = _Layout(rank, size, local_rank, local_size, cross_rank, cross_size, owns)


def _layout() -> _Layout:
    if _LAYOUT is None:
        raise ValueError(NOT_INITIALIZED)
    return _LAYOUT


def is_initialized() -> bool:
    return _LAYOUT is not None


def shutdown() -> None:
    """Leave the job; the process group goes too if ``init()`` made it."""
    global _LAYOUT
    layout, _LAYOUT = _LAYOUT, None
    if layout is not None and layout.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def rank() -> int:
    return _layout().rank


def size() -> int:
    return _layout().size


def local_rank() -> int:
    return _layout().local_rank


def local_size() -> int:
    return _layout().local_size


def cross_rank() -> int:
    return _layout().cross_rank


def cross_size() -> int:
    return _layout().cross_size


def is_homogeneous() -> bool:
    """Every node runs the same number of ranks (always so under our launcher)."""
    layout = _layout()
    return layout.local_size * layout.cross_size == layout.size


def mpi_threads_supported() -> bool:
    _layout()
    return False


def mpi_enabled() -> bool:
    _layout()
    return dist.get_backend() == "mpi"


def mpi_built() -> bool:
    from ..distributed.transports import available_transports
    return "mpi" in available_transports()


def gloo_enabled() -> bool:
    return False


def nccl_built() -> int:
    return 0
