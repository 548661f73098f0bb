"""The process group a ``Trainer`` trains in when the script made none.

Started by our launcher, torchrun, mpirun or srun, every process is told its place in the job
(RANK/WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_PROCID/SLURM_NTASKS, ...). A Trainer built before
``init_process_group`` joins that job itself, through ``init_process_group``'s own reading of
the environment, rather than training a world of one on every rank: those copies would each
train alone, look healthy, and write into the same folders. With no launcher's variables set,
the same call makes a job of one. If joining fails, the error names the variables that
described the job.
"""
from __future__ import annotations

from ..distributed import get_backend, get_rank, get_world_size, init_process_group, is_initialized


def join_job(backend: str = "auto", announce: bool = True) -> bool:
    """Join the job the environment describes, unless a process group already exists.

    True when this call made the group (its maker ends it); ``announce``: rank 0 prints one
    line when it joined a job of several ranks."""
    if is_initialized():
        return False
    try:
        init_process_group(backend)
    except Exception as exc:
        raise RuntimeError(f"Trainer: no process group was initialized, so it joins the job the "
                           f"environment describes{_described()} with "
                           f"init_process_group(backend={backend!r}), which failed: {exc}"
                           ) from exc
    size = get_world_size()
    if announce and size > 1 and get_rank() == 0:
        from ..distributed.group.world import world
        info = world().info
        print(f"Trainer: joined the job's process group: {size} ranks over {get_backend()} (from "
              f"{info.sources['rank']}, {info.sources['world_size']}); it ends when fit() "
              f"returns", flush=True)
    return True


def _described() -> str:
    """The variables that set the rank and world size as the resolver read them, in the form
    ' (RANK=1, WORLD_SIZE=2)'; '' when it cannot read them (its error, raised, names them)."""
    from ..distributed.rendezvous.env import resolve
    try:
        info = resolve(master_needed=False)
    except ValueError:
        return ""
    return f" ({info.sources['rank']}, {info.sources['world_size']})"
