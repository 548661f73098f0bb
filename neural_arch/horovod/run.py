"""``python -m neural_arch.horovod.run -np N [-H host:slots,...] command...``: the project's
``horovodrun``, on our launcher (``neural_arch.distributed.launcher``).

Each of the N ranks runs ``command`` (``python train.py --lr 0.1``, say) with the launcher's
variables and Horovod's (``worker``). How Horovod's options map onto the launcher's:

- no ``-H``, or one local host (``localhost``, ``127.0.0.1``, this machine's name): N workers
  on this machine, a free rendezvous port, backend ``auto`` (shared memory);
- several hosts: Horovod would start the remote ranks over ssh; this runner does not. Run the
  same command on every host with ``--node-rank K`` (K = the host's position in ``-H``): it
  becomes the launcher's ``--nnodes=<hosts> --node_rank=K --master_addr=<first host>
  --master_port=<-p, default 29500> --nproc_per_node=<slots>`` on the ``tcp`` backend. Ranks
  fill the hosts in order; every host used must run the same number of them (the launcher
  starts the same count on each node). Set NEURAL_ARCH_SECRET to one value on every host.
"""
from __future__ import annotations

import argparse
import socket
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

PROG = "python -m neural_arch.horovod.run"
_LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


@dataclass
class Plan:
    """What one host's launcher is asked to do."""
    command: List[str]
    nproc_per_node: int
    nnodes: int = 1
    node_rank: int = 0
    master_addr: str = "127.0.0.1"
    master_port: Optional[int] = None  # None: single host, a free port (standalone)
    backend: str = "auto"
    options: Dict[str, object] = field(default_factory=dict)

    def launcher_kwargs(self) -> Dict[str, object]:
        kwargs = dict(nproc_per_node=self.nproc_per_node, nnodes=self.nnodes,
                      node_rank=self.node_rank, master_addr=self.master_addr,
                      backend=self.backend, script_args=self.command, run_module=True,
                      **self.options)
        if self.master_port is None:
            kwargs["standalone"] = True
        else:
            kwargs["master_port"] = self.master_port
        return kwargs


def parse_hosts(text: str) -> List[Tuple[str, int]]:
    """``"a:2,b:2"`` -> [("a", 2), ("b", 2)]; a host without ``:slots`` has 1 slot."""
    hosts = []
    for item in text.split(","):
        item = item.strip()
        name, _, slots = item.rpartition(":") if ":" in item else (item, "", "1")
        if not name or not slots.isdigit() or int(slots) < 1:
            raise ValueError(f"-H: {item!r} is not host:slots (slots a positive integer), in "
                             f"{text!r}")
        hosts.append((name, int(slots)))
    names = [h for h, _ in hosts]
    if len(set(names)) != len(names):
        raise ValueError(f"-H names a host more than once: {text!r}")
    return hosts


def _is_local(host: str) -> bool:
    return host in _LOCAL_NAMES or host in (socket.gethostname(), socket.getfqdn())


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG, usage=f"{PROG} -np N [-H host:slots,...] [options] command [args...]",
        description="Run COMMAND as N Horovod ranks (neural_arch.horovod) on our launcher.")
    parser.add_argument("-np", "--num-proc", dest="np", type=int, required=True,
                        help="number of ranks")
    parser.add_argument("-H", "--hosts", default=None,
                        help="host:slots,... ; several hosts need --node-rank on each")
    parser.add_argument("--node-rank", type=int, default=None,
                        help="this host's position in -H (multi-host runs)")
    parser.add_argument("-p", "--port", type=int, default=None,
                        help="rendezvous port on the first host (multi-host; default 29500)")
    parser.add_argument("--backend", default=None, choices=("auto", "shm", "tcp"),
                        help="transport; default auto on one host, tcp across hosts")
    parser.add_argument("--timeout", type=float, default=None,
                        help="stop every rank and exit 124 after this many seconds")
    parser.add_argument("--log-dir", default=None, help="also write rank_<R>.log files here")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the command every rank runs")
    return parser


def plan(argv: Sequence[str]) -> Plan:
    """The launcher run for this host; ValueError naming what does not fit."""
    args = build_parser().parse_args(list(argv))
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ValueError("no command to run: give it after the options, e.g. "
                         f"{PROG} -np 2 python train.py")
    if args.np < 1:
        raise ValueError(f"-np must be >= 1, got {args.np}")
    options = {k: v for k, v in (("timeout", args.timeout), ("log_dir", args.log_dir))
               if v is not None}
    hosts = parse_hosts(args.hosts) if args.hosts else [("localhost", args.np)]
    total = sum(s for _, s in hosts)
    if args.np > total:
        raise ValueError(f"-np {args.np} asks for more ranks than the {total} slots of -H "
                         f"{args.hosts}")
    # Ranks fill the hosts in order, as horovodrun places them.
    used, left = [], args.np
    for name, slots in hosts:
        if left:
            used.append((name, min(slots, left)))
            left -= used[-1][1]
    if len(used) == 1:
        name, count = used[0]
        if not _is_local(name):
            raise ValueError(f"-H {args.hosts}: the ranks would all run on {name!r}, another "
                             "machine; this runner starts processes only here: run the "
                             "command on that machine")
        if args.node_rank not in (None, 0):
            raise ValueError(f"--node-rank {args.node_rank} given for a single-host run")
        return Plan(command, count, backend=args.backend or "auto", options=options)
    counts = {c for _, c in used}
    if len(counts) != 1:
        raise ValueError(f"-np {args.np} over -H {args.hosts} places {[c for _, c in used]} "
                         "ranks on the hosts; the launcher runs the same number on every "
                         "host: choose -np and slots so that every host used gets as many")
    if args.node_rank is None:
        lines = "\n".join(f"  on {name}: {PROG} -np {args.np} -H {args.hosts} --node-rank {k} "
                          f"{' '.join(command)}" for k, (name, _) in enumerate(used))
        raise ValueError("a multi-host run is started on every host (no ssh from here); run\n"
                         + lines)
    if not 0 <= args.node_rank < len(used):
        raise ValueError(f"--node-rank must be in [0, {len(used)}) for the hosts {used}, got "
                         f"{args.node_rank}")
    if args.backend in ("auto", "shm"):
        raise ValueError(f"--backend {args.backend} cannot join ranks on different hosts; "
                         "leave it out (tcp)")
    return Plan(command, counts.pop(), nnodes=len(used), node_rank=args.node_rank,
                master_addr=used[0][0], master_port=args.port or 29500, backend="tcp",
                options=options)


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        the_plan = plan(argv)
    except ValueError as exc:
        build_parser().error(str(exc))
    from ..distributed.launcher import DistributedLauncher, LaunchError
    try:
        launcher = DistributedLauncher("neural_arch.horovod.worker",
                                       **the_plan.launcher_kwargs())
        return launcher.run()
    except (ValueError, TypeError, LaunchError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
