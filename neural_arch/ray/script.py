"""A script as the training loop: what ``python -m neural_arch.cli train --backend ray`` runs.

Each Ray worker runs the script as ``python SCRIPT ARGS...`` would, in the worker's process:
``sys.argv`` is set, the script's folder leads the import path, the driver's working directory
is the worker's, and the script runs as ``__main__``. The script reaches the job as under our
launcher (``init_process_group()`` or a ``Trainer``), and may call ``neural_arch.ray.report``.

Through Ray Client (a ``ray://`` address) the driver's files are not on the cluster: the
script's folder travels as the job's ``working_dir`` (Ray uploads it, and unpacks it on every
node), and each worker runs its copy of the script there, that folder being its working
directory, as ``ray job submit --working-dir`` does.
"""
from __future__ import annotations

import os
import runpy
import sys
import time
from typing import Optional, Sequence

from .config import FailureConfig, RunConfig, ScalingConfig
from .result import TrainingFailedError
from .runtime import cluster_address, ensure_ray, is_client_address, require_ray
from .trainer import RayTrainer


def run_script(config: dict) -> None:
    """The loop: run ``config["script"]`` with ``config["argv"]`` (a script shipped in the
    job's working_dir is named relative to it: the worker's working directory)."""
    script = os.path.abspath(config["script"])
    if config.get("cwd") and os.path.isdir(config["cwd"]):
        os.chdir(config["cwd"])
    if config.get("comm_backend"):
        os.environ["NEURAL_ARCH_BACKEND"] = config["comm_backend"]
    sys.argv = [script, *config["argv"]]
    sys.path.insert(0, os.path.dirname(script))
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # sys.exit(0) ends a script well; anything else fails its worker
        if exc.code not in (None, 0):
            raise RuntimeError(f"{script} exited with {exc.code!r}") from exc


def run_script_on_ray(script: str, argv: Sequence[str], workers: int,
                      address: Optional[str] = None, max_failures: int = 0,
                      comm_backend: Optional[str] = None) -> int:
    """Run ``script`` on ``workers`` Ray workers; the exit code for the command line."""
    script = os.path.abspath(script)
    stem = os.path.splitext(os.path.basename(script))[0]
    config = {"script": script, "argv": list(argv), "cwd": os.getcwd(),
              "comm_backend": comm_backend}
    shipped = is_client_address(cluster_address(address))
    if shipped:
        config.update(script=os.path.basename(script), cwd=None)
    name = f"{stem}_{time.strftime('%Y-%m-%d_%H-%M-%S')}_{os.getpid()}"
    trainer = RayTrainer(run_script, train_loop_config=config,
                         scaling_config=ScalingConfig(num_workers=workers),
                         run_config=RunConfig(name=name,
                                              failure_config=FailureConfig(max_failures)),
                         address=address)
    started = shipped and ensure_ray(address, runtime_env={
        "working_dir": os.path.dirname(script)})
    try:
        result = trainer.fit()
    except TrainingFailedError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        if started:
            require_ray().shutdown()
    print(f"{script}: {workers} Ray workers finished; run folder {result.path}", flush=True)
    return 0
