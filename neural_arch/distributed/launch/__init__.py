"""The launcher's parts; ``python -m neural_arch.distributed.launcher`` is its command line.

``supervisor`` starts, watches, restarts and tears down the workers (``DistributedLauncher``,
``launch_distributed_training``), ``startup`` builds the workers' command and checks the master
port before any starts, ``args`` parses the command line, ``config`` is one run as validated
data plus the workers' environment, and ``workers`` one worker process and its output.
"""
from __future__ import annotations

from .supervisor import (DistributedLauncher, LaunchError, LaunchOutcome,
                         launch_distributed_training, main)

__all__ = ["DistributedLauncher", "LaunchError", "LaunchOutcome", "launch_distributed_training",
           "main"]
