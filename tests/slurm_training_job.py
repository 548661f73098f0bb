"""The job the SLURM tests run inside an allocation (no tests here): whatever started it (srun,
the launcher, mpirun), every rank joins with ``init_process_group("auto")``, all-reduces its
rank, trains ``ddp_cases``' small MLP with DistributedDataParallel and writes what it saw to
``<out>/rank<R>.npz``, so that the test, outside the job, can check the sum, the trained
parameters against one process trained on the whole batch, and where the rendezvous came from.

    python tests/slurm_training_job.py OUT_DIR
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ddp_cases, next to this file

from ddp_cases import ddp_worker  # noqa: E402

from neural_arch import distributed as dist  # noqa: E402


def main() -> None:
    out = Path(sys.argv[1])
    dist.init_process_group(backend="auto")
    info = dist.get_distributed_info()
    rank, world = dist.get_rank(), dist.get_world_size()
    total = dist.all_reduce(np.array([float(rank)]), dist.ReduceOp.SUM)
    params, _ = ddp_worker(rank, world, "sgd", True, 1)
    # what the resolver decided, so the test can tell an srun-started rank from a launched one
    np.savez(out / f"rank{rank}.npz", *params, rank=rank, world=world, total=total,
             backend=info["backend"], launcher=info["launcher"],
             master=f"{info['master_addr']}:{info['master_port']}",
             job_id=os.environ.get("SLURM_JOB_ID", ""),
             step_id=os.environ.get("SLURM_STEP_ID", ""))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
