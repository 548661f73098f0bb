"""``--world-size N`` without ``--rank`` and outside any launcher: the program starts its own N
ranks on this host, by running itself under ``python -m neural_arch.distributed.launcher
--standalone`` (a free rendezvous port, the workers watched and all stopped when one fails),
and exits with the launcher's code: 0 when every rank succeeded, else the failing rank's.

The ranks get the same command line, after ``--``: the launcher takes its own options
(``--master-port``, ``--backend``, ...) anywhere before it, and these share names with the
program's. ``--world-size`` stays in it; under the launcher it only has to agree with the
launcher's world size.
"""
from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from typing import List

# The variables of a job started by our launcher or torchrun, mpirun, or srun.
LAUNCHED_BY = ("WORLD_SIZE", "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS")
# How long the launcher gets, after Ctrl-C, to stop its workers and exit.
_INTERRUPT_GRACE_S = 30.0


def under_a_launcher() -> bool:
    return any(name in os.environ for name in LAUNCHED_BY)


def starts_its_own_ranks(args: argparse.Namespace) -> bool:
    """True when training with ``--world-size N > 1``, no ``--rank``, and no launcher around."""
    return (args.sample is None and args.world_size not in (None, 1) and args.rank is None
            and not under_a_launcher())


def launcher_command(world_size: int, argv: List[str]) -> List[str]:
    return [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone",
            f"--nproc_per_node={world_size}", "-m", "neural_arch.train_gpt", "--", *argv]


def launch_ranks(args: argparse.Namespace, argv: List[str]) -> int:
    """Run the job of ``argv`` (this program's arguments) in ``--world-size`` ranks; the exit
    code (128 + N for a launcher killed by signal N)."""
    print(f"--world-size {args.world_size} without --rank: starting {args.world_size} ranks on "
          f"this host (python -m neural_arch.distributed.launcher --standalone "
          f"--nproc_per_node={args.world_size} -m neural_arch.train_gpt ...)", flush=True)
    launcher = subprocess.Popen(launcher_command(args.world_size, argv))
    # a SIGTERM for this process is one for the job: the launcher stops its ranks on it
    previous = signal.signal(signal.SIGTERM, lambda *_: launcher.terminate())
    try:
        code = launcher.wait()
    except KeyboardInterrupt:
        # Ctrl-C reached the launcher too (same terminal): it stops the ranks; wait for that
        try:
            code = launcher.wait(timeout=_INTERRUPT_GRACE_S)
        except subprocess.TimeoutExpired:
            launcher.send_signal(signal.SIGKILL)
            launcher.wait()
            code = -signal.SIGINT
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 128 - code if code < 0 else code


__all__ = ["LAUNCHED_BY", "launch_ranks", "launcher_command", "starts_its_own_ranks",
           "under_a_launcher"]
