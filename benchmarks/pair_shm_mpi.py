"""Our shm collectives and MPI's own, taking turns batch by batch in the same processes.

``bench_collectives.py`` runs ours and MPI's in separate jobs; on a shared machine whose speed
drifts from second to second their ratio then compares moments. Here one ``mpiexec`` job holds
both: every rank also joins an shm process group, and each batch of calls (right after a
barrier) runs one contender, the contenders in a rotating order. A batch's time is the slowest
rank's per-call time; each contender reports its median over batches, and the pairs report the
median of the per-turn ratios (ours / MPI's, < 1: ours is faster), the figure least moved by
drift. One bias to know: mpi4py releases the GIL inside MPI's calls, so a background thread of
the process group may take it and delay MPI's return; on a loaded machine large MPI calls
were seen far slower here than in ``bench_collectives.py``'s own jobs. Trust the latency sizes
on any machine, the large ones on a quiet one.

Contenders: ``dist.broadcast`` from rank 0 against ``MPI_Bcast``,
``dist.all_gather_into_tensor`` against ``MPI_Allgather`` (a size is the gathered output's)
and ``dist.all_reduce`` (SUM, float32) against ``MPI_Allreduce`` at each ``--sizes``, and for
the all-reduce each ``--choices`` of the large shm algorithm (``tuning`` tags, e.g.
``whole@128K``), called through ``direct.all_reduce`` with that choice, at any size (below
``direct.SMALL_BYTES`` it stands against the one-generation plan that ``dist.all_reduce`` runs
there). A ``whole`` tag may name the form of its rounds after a colon, ``whole@256K:python``
or ``whole@256K:compiled`` (``pair_rounds``), to set the two in turns in one job; ``barrier``
sets ``dist.barrier`` against ``MPI_Barrier``. ``--matrix`` hands our public calls 2-D tensors
(views of the same buffers), as a layer's activations are. A batch holds ``--calls`` calls,
fewer of a large message (about BATCH_BYTES a batch, two at least). The job runs
``--world-size`` ranks (default 2; ``whole`` runs on two only). At the end the goals of
``bench_collectives.py`` that these pairs measure (``collectives_goals``: latency at 4 B -
1 KiB, the all-reduce's busbw at 4 KiB - 4 MiB) are judged from the contenders' medians, and
``--output FILE`` writes the pairs and those goals into FILE's ``pair_shm_mpi`` section:

    python benchmarks/pair_shm_mpi.py [--sizes 4,64,1K] [--collectives broadcast,all_reduce]
        [--choices whole@256K:python,whole@256K:compiled] [--calls 200] [--turns 60]
        [--against whole@256K:python] [--world-size 2] [--matrix] [--output FILE]
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), ROOT]

import bench_common as common  # noqa: E402
from bench_common import format_size, one_thread_per_rank, parse_size  # noqa: E402

one_thread_per_rank()

from bench_collectives import NATIVE_NAMES as PEERS  # noqa: E402 - MPI's call of each

SECTION = "pair_shm_mpi"
BATCH_BYTES = 32 << 20  # a batch of a large message: about this many bytes, 2 calls at least


def _choice(tag: str):
    from neural_arch.distributed.transports.shm.tuning import Choice
    algorithm, size = tag.split("@")
    return Choice(algorithm, parse_size(size))


def ours_name(collective: str) -> str:
    """Our public call of ``collective``, as ``contenders`` names it."""
    return ("dist.all_gather_into_tensor" if collective == "all_gather"
            else f"dist.{collective}")


def contenders(collective: str, nbytes: int, choices, comm, dist, c, np, matrix=False):
    """{name: one call}, each on its own buffer of ``nbytes``; with ``matrix`` our public
    call's tensor is 2-D (two rows where its elements split evenly, else one; an all-gather's
    output one row a rank, torch's stacked form), as a layer's activations are."""
    from neural_arch.distributed.reduce_ops import ReduceOp
    from neural_arch.distributed.transports.shm import direct
    from neural_arch.distributed.group.world import resolve_group
    n = max(1, nbytes // 4)
    bufs = {}
    if collective == "barrier":
        return {"dist.barrier": dist.barrier, PEERS[collective]: comm.Barrier}

    def buf(name):  # zeros: repeated in-place sums stay finite
        bufs[name] = np.zeros(n, np.float32)
        return bufs[name]

    def shaped(a, rows=None):  # a view: what the call changes is still ``a``'s
        return a.reshape(rows or (2 if a.size % 2 == 0 else 1), -1) if matrix else a
    if collective == "broadcast":
        ours, theirs = shaped(buf("ours")), buf("mpi")
        return {"dist.broadcast": lambda: dist.broadcast(ours, 0),
                PEERS[collective]: lambda: comm.Bcast(theirs, root=0)}
    if collective == "all_gather":  # the size is the gathered output's, as nccl-tests has it
        p = comm.Get_size()
        part = max(1, n // p)
        sent, got = np.zeros(part, np.float32), np.zeros(part * p, np.float32)
        mine, gathered = np.zeros(part, np.float32), shaped(np.zeros(part * p, np.float32), p)
        return {ours_name(collective): lambda: dist.all_gather_into_tensor(gathered, mine),
                PEERS[collective]: lambda: comm.Allgather(sent, got)}
    theirs, out = buf("mpi"), np.empty(n, np.float32)
    calls = {PEERS[collective]: lambda: comm.Allreduce(theirs, out)}
    ours, rounds = shaped(buf("ours")), c.pair_rounds
    default_form = rounds.choice
    if any(":" in tag for tag in choices):  # the forms set below: back to the default
        calls["dist.all_reduce"] = lambda: (setattr(rounds, "choice", default_form),
                                            dist.all_reduce(ours))
    else:
        calls["dist.all_reduce"] = lambda: dist.all_reduce(ours)
    pg = resolve_group(None)
    for tag in choices:
        mine, (name, _, form) = buf(tag), tag.partition(":")
        choice, form = _choice(name), form or default_form
        fp = pg.fingerprint("all_reduce:sum", mine.dtype, n)
        calls[f"shm {tag}"] = (lambda mine=mine, choice=choice, fp=fp, form=form: (
            setattr(rounds, "choice", form),
            direct.all_reduce(c, mine, ReduceOp.SUM, fp, choice)))
    return calls


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    port = None
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(comm.bcast(port)))
    from neural_arch import distributed as dist
    from neural_arch.distributed.group.world import resolve_group
    dist.init_process_group("shm")
    c = resolve_group(None).transport.collectives
    choices = [t for t in args.choices.split(",") if t]
    rows = []  # rank 0: one per contender and size, as ``collectives_goals`` reads rows
    for collective in args.collectives.split(","):
        sizes = [0] if collective == "barrier" else [parse_size(s) for s in
                                                     args.sizes.split(",")]
        if collective == "all_gather":  # what is gathered: at least a float32 a rank, once
            sizes = sorted({4 * size * max(1, nbytes // 4 // size) for nbytes in sizes})
        for nbytes in sizes:
            calls = contenders(collective, nbytes, choices, comm, dist, c, np, args.matrix)
            names = list(calls)
            per_batch = max(2, min(args.calls, BATCH_BYTES // max(nbytes, 1)))
            for name in names:  # warm: plans, compiled entries, page faults
                for _ in range(64):
                    calls[name]()
            times = {name: [] for name in names}
            for turn in range(args.turns):
                order = names[turn % len(names):] + names[:turn % len(names)]
                for name in order:
                    call = calls[name]
                    comm.Barrier()
                    dist.barrier()
                    start = time.perf_counter()
                    for _ in range(per_batch):
                        call()
                    mine = (time.perf_counter() - start) / per_batch
                    times[name].append(comm.allreduce(mine, op=MPI.MAX))
            if rank == 0:
                rows += _rows(collective, nbytes, size, times, np)
                peer = PEERS[collective]
                if args.against and f"shm {args.against}" in times:
                    peer = f"shm {args.against}"
                med = {k: float(np.median(v)) * 1e6 for k, v in times.items()}
                line = [f"{collective}" + (f" {format_size(nbytes)}:" if nbytes else ":")]
                for name in names:
                    ratio = np.median(np.array(times[name]) / np.array(times[peer]))
                    line.append(f"{name} {med[name]:.2f} us" + (
                        "" if name == peer else f" ({ratio:.3f}x {peer}, diff "
                        f"{med[name] - med[peer]:+.2f} us)"))
                print(" | ".join(line), flush=True)
    if rank == 0 and args.result:
        with open(args.result, "w") as f:
            json.dump(rows, f)
    dist.destroy_process_group()


def _rows(collective: str, nbytes: int, p: int, times: dict, np) -> list:
    """Our public call's row and MPI's at one size: each contender's median batch time (the
    slowest rank's), and on ours the median of the per-turn ratios to MPI's."""
    ours = np.array(times[ours_name(collective)])
    theirs = np.array(times[PEERS[collective]])
    base = {"collective": collective, "world_size": p, "bytes": nbytes}
    return [dict(base, backend="shm", seconds=float(np.median(ours)),
                 ratio=float(np.median(ours / theirs))),
            dict(base, backend="MPI native", seconds=float(np.median(theirs)))]


def report(rows: list, command: str) -> str:
    """The pairs and the goals they measure, as a markdown section."""
    import collectives_goals as goals
    method = ("Ours and MPI's own collective in the same processes under mpiexec, batch by "
              "batch in turns (a rotating order), each batch right after both barriers; a "
              "batch's time is its slowest rank's per-call time. Ours and MPI: each "
              "contender's median batch time; ratio: the median of the per-turn ratios of "
              "our time to MPI's (below 1: ours is faster). Goals: those of "
              "bench_collectives.py that these pairs measure, judged from the medians.")
    lines = common.section_head(f"Ours and MPI's collectives in turns (`{SECTION}.py`)",
                                command, common.machine_info(), method)
    table = []
    for ours in (r for r in rows if r["backend"] == "shm"):
        mpi = next(r for r in rows if r["backend"] == "MPI native" and all(
            r[k] == ours[k] for k in ("collective", "world_size", "bytes")))
        table.append([ours["collective"], ours["world_size"],
                      format_size(ours["bytes"]) if ours["collective"] != "barrier" else "-",
                      f"{ours['seconds'] * 1e6:.2f}", f"{mpi['seconds'] * 1e6:.2f}",
                      f"{ours['ratio']:.3f}x",
                      f"{(ours['seconds'] - mpi['seconds']) * 1e6:+.2f}"])
    lines += [common.markdown_table(["collective", "p", "size", "ours (us)", "MPI (us)",
                                     "ratio", "ours - MPI (us)"], table, "lrrrrrr"), ""]
    measured = [g for g in goals.size_goals(rows) if g[2] is not None]
    if measured:
        lines += [goals.goals_table(measured), ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4,64,1K")
    ap.add_argument("--collectives", default="broadcast,all_reduce")
    ap.add_argument("--choices", default="")
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--turns", type=int, default=60)
    ap.add_argument("--against", default="", help="a --choices tag the ratios are taken "
                    "against instead of MPI's call (medians of the per-turn ratios)")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--matrix", action="store_true",
                    help="our public call on a 2-D tensor (a view of the same buffer)")
    ap.add_argument("--output", action="append", default=[],
                    help="write the pairs and goals into this file's section (repeatable)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.world_size < 2:
        ap.error(f"--world-size must be at least 2, got {args.world_size}")
    wholes = [t for t in args.choices.split(",") if t.startswith("whole@")]
    if wholes and args.world_size != 2:
        ap.error(f"the 'whole' all-reduce runs on two ranks, not {args.world_size}: "
                 f"{', '.join(wholes)}")
    if args.worker:
        worker(args)
        return 0
    given = list(argv if argv is not None else sys.argv[1:])
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONUNBUFFERED="1")
    with tempfile.TemporaryDirectory() as tmp:
        result = os.path.join(tmp, "rows.json")
        cmd = ["mpiexec", "-n", str(args.world_size), "--oversubscribe", "--bind-to", "none",
               sys.executable, "-u", os.path.abspath(__file__), "--worker",
               "--result", result] + given
        code = subprocess.run(cmd, env=env, timeout=1800).returncode
        if code or not os.path.exists(result):
            return code or 1
        with open(result) as f:
            rows = json.load(f)
    text = report(rows, common.command_line("benchmarks/pair_shm_mpi.py", given))
    common.publish(text, args.output, SECTION)
    return 0


if __name__ == "__main__":
    sys.exit(main())
