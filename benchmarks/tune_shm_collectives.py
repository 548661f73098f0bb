"""Measure the shared-memory all-reduce's choices on this machine and write its tuning table.

For each message size (256 KiB to 16 MiB by 2x unless ``--sizes`` says otherwise: smaller
vectors take the prepared small path, which has no choices) every candidate, each algorithm
(``whole`` for two ranks, ``split``, and ``peer_read`` where the ranks can read each other's
memory) with each round size (for ``peer_read``: bytes per read), runs batches of SUM
all-reduces in one job, the candidates in a rotating order so that the machine's drift hits them alike; a
candidate's time is the median over its batches on the slowest rank. The fastest per size
becomes the table's row when it beats the built-in choice by MARGIN. The rows are this
machine's table (``tuning_file.machine()``: CPU model and count) in the output file,
replacing that machine's whole table (measure every world size it needs in one run) and
keeping the tables of other machines (``neural_arch.distributed.transports.shm.tuning``
reads the one of the machine it runs on):

    python benchmarks/tune_shm_collectives.py [--world-sizes 2] [--sizes 256K,1M,4M]
        [--rounds 128K,256K,512K,1M,2M] [--repeats 15]
        [--output neural_arch/distributed/transports/shm/tuning_table.json]

Every candidate's result is checked against the built-in choice's bits before it is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)), ROOT]

from bench_common import format_size, parse_size  # noqa: E402

DEFAULT_SIZES = "256K,512K,1M,2M,4M,8M,16M"
DEFAULT_ROUNDS = "128K,256K,512K,1M,2M"
DEFAULT_OUTPUT = os.path.join(ROOT, "neural_arch", "distributed", "transports", "shm",
                              "tuning_table.json")
BATCH_BYTES = 16 << 20  # bytes all-reduced per timed batch (at least 2 calls)
MARGIN = 0.05  # another choice replaces the built-in one only when this much faster: with ten
               # candidates on a noisy machine the fastest median alone is often chance


def worker(sizes, rounds, repeats, result_path):
    """One rank: time every candidate at every size; rank 0 writes the medians (us)."""
    import numpy as np
    from neural_arch import distributed as dist
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.distributed.reduce_ops import ReduceOp
    from neural_arch.distributed.transports.shm import direct, tuning
    dist.init_process_group("shm")
    pg = resolve_group(None)
    c, p = pg.transport.collectives, dist.get_world_size()
    c.pair_rounds.hot()  # time the form of the two-rank rounds a long job runs
    workspace = c.layout.workspace_bytes
    algorithms = ("whole", "split") if p == 2 else ("split",)
    peer_reads = c.t.peer_reads.usable
    if peer_reads:
        algorithms += ("peer_read",)
    candidates = [tuning.Choice(a, r) for a in algorithms for r in rounds
                  if r <= workspace or a == "peer_read"]
    out = {}
    for nbytes in sizes:
        n = nbytes // 4
        calls = max(2, BATCH_BYTES // nbytes)
        values = np.random.default_rng([dist.get_rank(), n]).standard_normal(n)
        values = values.astype(np.float32)
        expected = values.copy()
        direct.all_reduce(c, expected, ReduceOp.SUM, pg.fingerprint("all_reduce:sum",
                                                                    expected.dtype, n),
                          tuning.default_choice(p)._replace(round_bytes=min(1 << 20, workspace)))
        times = {cand: [] for cand in candidates}
        for cand in candidates:
            buf = values.copy()
            direct.all_reduce(c, buf, ReduceOp.SUM, pg.fingerprint("all_reduce:sum", buf.dtype,
                                                                   n), cand)
            if buf.tobytes() != expected.tobytes():
                raise RuntimeError(f"{cand.tag} at {nbytes} B gave other bits than the default")
        buf = np.zeros(n, np.float32)
        for rep in range(repeats):
            turn = rep % len(candidates)
            for cand in candidates[turn:] + candidates[:turn]:
                dist.barrier()
                start = time.perf_counter()
                for _ in range(calls):
                    direct.all_reduce(c, buf, ReduceOp.SUM,
                                      pg.fingerprint("all_reduce:sum", buf.dtype, n), cand)
                times[cand].append((time.perf_counter() - start) / calls)
        mine = {cand.tag: float(np.median(t)) for cand, t in times.items()}
        slowest = {tag: max(m[tag] for m in dist.all_gather_object(mine)) for tag in mine}
        out[nbytes] = slowest
        if dist.get_rank() == 0:
            best = min(slowest, key=slowest.get)
            print(f"p={p} {format_size(nbytes)}: " + ", ".join(
                f"{tag} {t * 1e6:.0f} us" for tag, t in sorted(slowest.items(),
                                                                key=lambda kv: kv[1]))
                  + f" -> {best}", flush=True)
    if dist.get_rank() == 0:
        with open(result_path, "w") as f:
            json.dump({"candidates": [list(cand) for cand in candidates],
                       "peer_reads": tuning.peer_level(peer_reads, c.t.peer_reads.writable),
                       "reads_pay": c.t.peer_reads.pays,
                       "times": {str(k): v for k, v in out.items()}}, f)
    dist.destroy_process_group()


def best(times, by_tag, default):
    """The fastest candidate of one size, if it beats the built-in choice by MARGIN."""
    fastest = min(times, key=times.get)
    if default.tag in times and times[fastest] > (1 - MARGIN) * times[default.tag]:
        return default
    return by_tag[fastest]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world-sizes", default="2")
    ap.add_argument("--sizes", default=DEFAULT_SIZES)
    ap.add_argument("--rounds", default=DEFAULT_ROUNDS)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--output", default=DEFAULT_OUTPUT)
    ap.add_argument("--worker", nargs=4, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        sizes, rounds, repeats, result = args.worker
        worker([parse_size(s) for s in sizes.split(",")],
               [parse_size(s) for s in rounds.split(",")], int(repeats), result)
        return 0
    from neural_arch.distributed.transports.shm import tuning, tuning_file
    from neural_arch.distributed.transports.shm.cross_memory import PeerReads
    # the file the table goes into, checked before anything is measured: a run is long
    tuning_file.existing(args.output, tuning.tables)
    # whether any world size's peer_read candidates ran with peer writes: one flag for the
    # table, so a world size measured without them is flagged too (its rows then need writes,
    # the safe side: without them the built-in choice runs)
    writes = False
    chosen, measured = {}, {"cpus": os.cpu_count(), "repeats": args.repeats,
                            "command": "python benchmarks/tune_shm_collectives.py "
                                       + " ".join(argv if argv is not None else sys.argv[1:])}
    probe = PeerReads(0, 1)
    try:  # what decides the built-in choice on a machine without a table (``reads_pay``)
        ratio = probe.read_cost_ratio()
    finally:
        probe.close()
    measured["read_cost_ratio"] = None if ratio is None else round(ratio, 2)
    print(f"a read through the kernel costs {ratio and round(ratio, 2)} copies of its bytes")
    for p in (int(x) for x in args.world_sizes.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            result = os.path.join(tmp, "times.json")
            env = dict(os.environ)
            env.pop(tuning.ENV_TABLE, None)
            cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone",
                   "--nproc_per_node", str(p), "--backend", "shm", os.path.abspath(__file__),
                   "--", "--worker", args.sizes, args.rounds, str(args.repeats), result]
            subprocess.run(cmd, env=env, check=True, timeout=1800)
            with open(result) as f:
                data = json.load(f)
        writes = writes or data["peer_reads"] == tuning.READ_WRITE
        by_tag = {tuning.Choice(a, r).tag: tuning.Choice(a, r) for a, r in data["candidates"]}
        chosen[p] = [(int(size), best(times, by_tag, tuning.default_choice(
            p, int(size), data["peer_reads"], data["reads_pay"])))
            for size, times in data["times"].items()]
    table = tuning.write(args.output, chosen, measured, writes)
    print(json.dumps(table["all_reduce"], indent=1))
    print(f"wrote the table of {table['machine']!r} into {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
