"""``python -m neural_arch.distributed.launcher``: start, watch and tear down a group of workers.

This is the launcher's public face: the command line, and the names scripts import from here.
The work is done in ``launch/`` (``launch/supervisor.py`` runs the workers, ``launch/args.py``
reads this command line); ``python -m neural_arch.distributed.launcher --help`` lists the
options.
"""
from __future__ import annotations

import sys

from .launch.supervisor import (DistributedLauncher, LaunchError, launch_distributed_training,
                                main)

__all__ = ["DistributedLauncher", "LaunchError", "launch_distributed_training", "main"]

if __name__ == "__main__":
    sys.exit(main())
