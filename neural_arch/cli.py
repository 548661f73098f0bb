"""``python -m neural_arch.cli train --script train.py --nproc N --backend ddp|horovod|ray``: one
command line that starts a training script on any of the engines the project runs on.

- ``ddp`` (also ``pytorch-ddp``): the script's ranks start under our launcher
  (``neural_arch.distributed.launcher``), which sets the variables ``init_process_group`` reads.
- ``horovod``: the same through our ``horovodrun`` (``neural_arch.horovod.run``), which also sets
  ``HOROVOD_RANK`` and the others that ``hvd.init()`` reads.
- ``ray``: the script runs as the training loop of N Ray workers (``neural_arch.ray``), each a
  Ray actor that joins the job's process group; on a Ray started for the command, or on a
  running cluster with ``--address`` (or ``RAY_ADDRESS``); through Ray Client (``ray://``) the
  script's folder travels to the cluster as the job's working_dir. ``--max-restarts`` restarts
  the workers after a failure, from the last checkpoint reported.

Run under a launcher already (``horovodrun -np 8 python -m neural_arch.cli train --script
train.py --backend horovod``, torchrun, srun, mpirun), the command runs the script in this
process: the launcher has started the ranks. The seed spellings are accepted: ``--num-gpus N``
for ``--nproc N``, ``--num-nodes`` for ``--nnodes`` and ``--gpus-per-node`` for ``--nproc``
with several nodes. Without CUDA each "GPU" is a CPU process.
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
from typing import List, Optional, Sequence

PROG = "python -m neural_arch.cli"
BACKENDS = {"ddp": "ddp", "pytorch-ddp": "ddp", "torch-ddp": "ddp", "horovod": "horovod",
            "ray": "ray"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    train = commands.add_parser("train", help="run a training script on N processes",
                                description="Start SCRIPT's ranks on the chosen engine.")
    train.add_argument("--script", required=True, help="the training script every rank runs")
    size = train.add_mutually_exclusive_group()
    size.add_argument("--nproc", "--nproc-per-node", type=int, default=None,
                      help="processes on this node (default 1)")
    size.add_argument("--num-gpus", type=int, default=None,
                      help="the seed's spelling of --nproc on one node")
    size.add_argument("--gpus-per-node", type=int, default=None,
                      help="the seed's spelling of --nproc with --num-nodes")
    train.add_argument("--nnodes", "--num-nodes", dest="nnodes", type=int, default=1,
                       help="nodes in the job (default 1); start the command on each")
    train.add_argument("--node-rank", type=int, default=0, help="this node's rank (default 0)")
    train.add_argument("--master-addr", default=None, help="rank 0's host (default: local)")
    train.add_argument("--master-port", type=int, default=None, help="rank 0's store port")
    train.add_argument("--backend", default="ddp", type=str.lower,
                       help="ddp (or pytorch-ddp), horovod or ray; default ddp")
    train.add_argument("--comm-backend", default=None, choices=("auto", "shm", "tcp"),
                       help="the collectives' transport (default: auto, shm on one host)")
    train.add_argument("--address", default=None, help="a Ray cluster's address (ray only)")
    train.add_argument("--max-restarts", type=int, default=0,
                       help="restart the ranks after a failure up to this many times (ddp, "
                            "ray)")
    train.add_argument("script_args", nargs=argparse.REMAINDER,
                       help="arguments for the script, after --")
    return parser


def _script_args(args: argparse.Namespace) -> List[str]:
    rest = list(args.script_args)
    return rest[1:] if rest[:1] == ["--"] else rest


def _nproc(args: argparse.Namespace) -> int:
    value = next((v for v in (args.nproc, args.num_gpus, args.gpus_per_node) if v is not None), 1)
    if value < 1:
        raise ValueError(f"the number of processes must be >= 1, got {value}")
    return value


def _check(args: argparse.Namespace) -> str:
    backend = BACKENDS.get(args.backend)
    if backend is None:
        raise ValueError(f"--backend {args.backend!r} is not one of "
                         f"{', '.join(sorted(BACKENDS))}")
    if backend == "ray" and importlib.util.find_spec("ray") is None:
        raise ValueError("--backend ray needs Ray, which is not installed: "
                         "pip install 'neural-arch[ray]'")
    if backend == "ray" and args.nnodes > 1:
        raise ValueError("--backend ray places the workers on the cluster's nodes itself; "
                         "drop --nnodes and give --nproc the number of workers")
    if args.address is not None and backend != "ray":
        raise ValueError(f"--address {args.address!r} names a Ray cluster; it applies to "
                         f"--backend ray only, not {args.backend}")
    if not os.path.isfile(args.script):
        raise ValueError(f"--script {args.script!r} is not a file")
    if args.nnodes < 1 or not 0 <= args.node_rank < args.nnodes:
        raise ValueError(f"--node-rank must be in [0, {args.nnodes}) with --nnodes "
                         f"{args.nnodes}, got {args.node_rank}")
    if backend == "horovod" and args.nnodes > 1:
        raise ValueError("--backend horovod starts one node's ranks here; for several nodes "
                         "use horovodrun -H host1:N,host2:N (python -m neural_arch.horovod.run)")
    return backend


def run_here(script: str, script_args: Sequence[str], backend: str) -> int:
    """Run the script in this process: a launcher has already made it a rank."""
    if backend == "horovod" and "HOROVOD_RANK" not in os.environ and "RANK" in os.environ:
        from .horovod.worker import horovod_environment
        os.environ.update(horovod_environment(os.environ))
    sys.argv = [script, *script_args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
    runpy.run_path(script, run_name="__main__")
    return 0


def launch(args: argparse.Namespace, backend: str) -> int:
    """Start the script's ranks on this node through the chosen engine's starter."""
    nproc, script_args = _nproc(args), _script_args(args)
    if backend == "ray":
        from .ray.script import run_script_on_ray
        return run_script_on_ray(args.script, script_args, nproc, args.address,
                                 args.max_restarts, args.comm_backend)
    if backend == "horovod":
        from .horovod.run import main as horovodrun
        argv = ["-np", str(nproc)]
        if args.comm_backend:
            argv += ["--backend", args.comm_backend]
        return horovodrun(argv + [sys.executable, args.script, *script_args])
    from .distributed.launcher import main as launcher
    argv = ["--nproc-per-node", str(nproc), "--nnodes", str(args.nnodes),
            "--node-rank", str(args.node_rank), "--max-restarts", str(args.max_restarts)]
    if args.master_addr:
        argv += ["--master-addr", args.master_addr]
    if args.master_port is not None:
        argv += ["--master-port", str(args.master_port)]
    if args.comm_backend:
        argv += ["--backend", args.comm_backend]
    return launcher(argv + [args.script, "--", *script_args])


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(sys.argv[1:] if argv is None else list(argv))
    try:
        backend = _check(args)
    except ValueError as exc:
        parser.error(str(exc))
    from .training.launching.fit import under_launcher
    if under_launcher():
        return run_here(args.script, _script_args(args), backend)
    return launch(args, backend)


if __name__ == "__main__":
    sys.exit(main())
