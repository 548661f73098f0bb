"""The tables, goals and plot of ``bench_collectives.py``, from the rows its jobs measured.

A row is one point: collective, world size, backend (``shm``/``tcp``/``mpi``, ``MPI native``,
the ``buffer stream`` and ``copy exchange`` references, or ``<backend> fresh data``: a broadcast,
all-gather or reduce-scatter whose inputs were rewritten before every call), message bytes (0
for a barrier),
algorithm and the median seconds per call. The goals are computed in ``collectives_goals``.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import bench_common as common
# re-exported: the scripts and tests use these as collectives_report.<name>
from collectives_goals import (AVERAGE, BARRIER, LOOP, NATIVE, earlier_goals,  # noqa: F401
                               goals, goals_table, size_goals)

# the collectives with a message size (reduce_scatter and the rooted reduce, gather and
# scatter: timed only when asked for)
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "gather",
               "scatter")
STREAM = "buffer stream"
EXCHANGE = "copy exchange"
FRESH = " fresh data"  # a row whose inputs were rewritten before every call
TURNS_MAX_BYTES = 16 << 20  # the rows of a size up to this are timed in turns, a batch each
# per round (``bench_collectives._in_turns``); larger ones one after another, holding one
# row's buffers at a time
LOOP_TURN_CALLS = 5  # the plain loop's calls per round of the turns, at least
REFERENCES = (STREAM, EXCHANGE)  # rows that time something else than a collective: unchecked


def fresh(backend: str) -> str:
    """The label of ``backend``'s calls timed with their inputs rewritten before each."""
    return backend + FRESH


BACKEND_ORDER = ("shm", AVERAGE, LOOP, "tcp", "mpi", NATIVE) \
    + tuple(fresh(b) for b in ("shm", "tcp", "mpi", NATIVE)) + (STREAM, EXCHANGE)
PEERS = (NATIVE, fresh(NATIVE), STREAM, EXCHANGE)  # rows measured beside ours, given no ratio
SIZE_GOALS_HEADING = ("### Goals at every size: latency, middle sizes, AVERAGE "
                      "(shm against MPI native, p = 2 and 4)")
SIZE_GOALS_NOTE = (
    "Latency through the public calls at 4 B - 1 KiB (p = 2: at most MPI native's time + 1 us; "
    "p = 4: at most 1.5x it), all_reduce busbw at 4 KiB - 4 MiB (at least MPI native's), and "
    "the AVERAGE all-reduce and the plain loop against the batched SUM at every size (time at "
    "most 1.05x). A goal over sizes is judged at its worst measured size, named with its "
    "figures (ours vs the other) and the sizes measured; \"-\" when no pair was measured.")
EARLIER_GOALS_HEADING = "### Earlier goals (large all-reduces, the 4-byte all-reduce, tcp)"


def bus_factor(collective: str, p: int) -> float:
    """algbw to busbw, as in nccl-tests (its reduce, gather and scatter tests too)."""
    return {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p,
            "reduce_scatter": (p - 1) / p, "broadcast": 1.0, "reduce": 1.0,
            "gather": (p - 1) / p, "scatter": (p - 1) / p}[collective]


def median_over_runs(rows: Sequence[dict]) -> List[dict]:
    """One row per (collective, world size, backend, bytes): the median time of its runs."""
    runs: Dict[tuple, List[dict]] = {}
    for row in rows:
        key = (row["collective"], row["world_size"], row["backend"], row["bytes"])
        runs.setdefault(key, []).append(row)
    return [dict(found[0], seconds=common.median([r["seconds"] for r in found]),
                 runs=len(found), run_seconds=[r["seconds"] for r in found])
            for found in runs.values()]


def _lookup(rows: Sequence[dict], collective: str, p: int, backend: str,
            nbytes: int) -> Optional[dict]:
    for row in rows:
        if (row["collective"], row["world_size"], row["backend"], row["bytes"]) == \
                (collective, p, backend, nbytes):
            return row
    return None


def bandwidths(row: dict) -> Tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second)."""
    algbw = row["bytes"] / row["seconds"] / 1e9
    return algbw, algbw * bus_factor(row["collective"], row["world_size"])


def speed_vs_native(rows: Sequence[dict], row: dict) -> Optional[float]:
    """How many times faster than MPI native on the same collective, size and world size (a
    fresh-data row: than MPI native rewriting its inputs the same way)."""
    peer = fresh(NATIVE) if row["backend"].endswith(FRESH) else NATIVE
    native = _lookup(rows, row["collective"], row["world_size"], peer, row["bytes"])
    return None if native is None else native["seconds"] / row["seconds"]


def tables(rows: Sequence[dict]) -> str:
    order = {name: i for i, name in enumerate(BACKEND_ORDER)}
    parts = []
    for collective in COLLECTIVES:
        for p in sorted({r["world_size"] for r in rows if r["collective"] == collective}):
            chosen = sorted((r for r in rows if (r["collective"], r["world_size"]) ==
                             (collective, p)), key=lambda r: (r["bytes"],
                                                              order.get(r["backend"], 9)))
            body = []
            for row in chosen:
                algbw, busbw = bandwidths(row)
                ratio = speed_vs_native(rows, row)
                body.append([common.format_size(row["bytes"]), row["backend"], row["algorithm"],
                             f"{row['seconds'] * 1e6:.1f}", f"{algbw:.3g}", f"{busbw:.3g}",
                             "" if ratio is None or row["backend"] in PEERS
                             else f"{ratio:.2f}x"])
            parts.append(f"### {collective}, p = {p}\n\n" + common.markdown_table(
                ["size", "backend", "algorithm", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                 "speed vs MPI native"], body, "lllrrrr"))
    parts += barrier_tables(rows)
    return "\n\n".join(parts)


def barrier_tables(rows: Sequence[dict]) -> List[str]:
    """One table per world size of the barrier's time (no message, so no bandwidths)."""
    order = {name: i for i, name in enumerate(BACKEND_ORDER)}
    parts = []
    for p in sorted({r["world_size"] for r in rows if r["collective"] == BARRIER}):
        chosen = sorted((r for r in rows if (r["collective"], r["world_size"]) == (BARRIER, p)),
                        key=lambda r: order.get(r["backend"], 9))
        body = []
        for row in chosen:
            ratio = speed_vs_native(rows, row)
            body.append([row["backend"], row["algorithm"], f"{row['seconds'] * 1e6:.1f}",
                         "" if ratio is None or row["backend"] in PEERS else f"{ratio:.2f}x"])
        parts.append(f"### {BARRIER}, p = {p}\n\n" + common.markdown_table(
            ["backend", "algorithm", "time (us)", "speed vs MPI native"], body, "llrr"))
    return parts


def runs_line(rows: Sequence[dict], p: int = 2, nbytes: int = 16 << 20) -> str:
    """Each run's busbw of the all-reduce point the 2x goal is hardest at, per backend, so that
    a run caught in a spell of slow copying between the cores stands out from the others."""
    parts = []
    for backend in BACKEND_ORDER:
        row = _lookup(rows, "all_reduce", p, backend, nbytes)
        if row is not None and row.get("run_seconds"):
            factor = bus_factor("all_reduce", p) * nbytes / 1e9
            parts.append(f"{backend} " + ", ".join(f"{factor / s:.3g}"
                                                   for s in row["run_seconds"]))
    if not parts:
        return ""
    return (f"All-reduce busbw of each run at {common.format_size(nbytes)}, p = {p} (GB/s, "
            f"in run order): " + "; ".join(parts) + ".")


PLOT_METRICS = {  # y value of a row, y label, title
    "busbw": (lambda row: bandwidths(row)[1], "bus bandwidth (GB/s)",
              "float32 collectives: bus bandwidth (nccl-tests definition) vs size"),
    "latency": (lambda row: row["seconds"] * 1e6, "time per call (us)",
                "float32 collectives: time per call through the public calls vs size"),
}


def plot(rows: Sequence[dict], path: str, metric: str = "busbw") -> List[str]:
    """Bus bandwidth (``metric="busbw"``) or time per call (``"latency"``) against size,
    log-log: one column per collective, one row per world size, one line per backend (the same
    colour in every panel). Returns the panels' titles."""
    if metric not in PLOT_METRICS:
        raise ValueError(f"plot metric must be one of {sorted(PLOT_METRICS)}, got {metric!r}")
    y_of, y_label, title = PLOT_METRICS[metric]
    plt = common.pyplot()
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    collectives = [c for c in COLLECTIVES if any(r["collective"] == c for r in rows)]
    world_sizes = sorted({r["world_size"] for r in rows})
    if not collectives:
        return []
    fig, axes = plt.subplots(len(world_sizes), len(collectives), sharex=True, sharey=True,
                             figsize=(5 * len(collectives), 3.8 * len(world_sizes) + 0.8),
                             squeeze=False)
    colours = {b: f"C{i}" for i, b in enumerate(BACKEND_ORDER)}
    styles = {NATIVE: "--", STREAM: ":", EXCHANGE: "-.", AVERAGE: (0, (1, 1)),
              LOOP: (0, (3, 1, 1, 1)), fresh(NATIVE): (0, (5, 1, 1, 1, 1, 1))}
    styles.update({fresh(b): (0, (5, 1)) for b in ("shm", "tcp", "mpi")})
    handles: Dict[str, object] = {}
    titles = []
    for ax_row, p in zip(axes, world_sizes):
        for ax, collective in zip(ax_row, collectives):
            for backend in BACKEND_ORDER:
                points = sorted((r["bytes"], y_of(r)) for r in rows
                                if (r["collective"], r["world_size"], r["backend"]) ==
                                (collective, p, backend))
                if points:
                    handles[backend], = ax.plot(*zip(*points), marker="o", markersize=3,
                                                label=backend, color=colours[backend],
                                                linestyle=styles.get(backend, "-"))
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=16))
            ax.xaxis.set_major_formatter(FuncFormatter(
                lambda x, _: common.format_size(int(round(x))) if x >= 1 else ""))
            ax.xaxis.set_minor_formatter(NullFormatter())
            titles.append(f"{collective}, p = {p}")
            ax.set_title(titles[-1])
            ax.grid(True, which="both", alpha=0.3)
        ax_row[0].set_ylabel(y_label)
    for ax in axes[-1]:
        ax.set_xlabel("message size (all_gather, gather: gathered output; reduce_scatter, "
                      "scatter: input)")
    fig.suptitle(title)
    columns = min(len(handles), 2 * len(collectives) + 1)  # fits the figure's width
    legend_rows = -(-len(handles) // columns)
    fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=columns,
               frameon=False)
    fig.tight_layout(rect=(0, (0.06 if len(world_sizes) > 1 else 0.1) * (1 + legend_rows) / 2,
                           1, 1))
    common.save_figure(fig, path)
    return titles


def report(rows: Sequence[dict], failures: Sequence[str], command: str, machine: str) -> str:
    try:
        from neural_arch.distributed.transports.base import PAIR_ROOTED_MAX_BYTES
    except ImportError:  # a tree of the package older than the pair form: the tree only
        PAIR_ROOTED_MAX_BYTES = 0
    lines = common.section_head(
        "Collectives by backend (`benchmarks/bench_collectives.py`)", command, machine,
        "float32 buffers reused by every call. Time: median per-call time over batches of "
        "calls, each batch started right after a barrier; the slowest rank's median; the "
        "median of that over the runs of the job (--repeats, interleaved with the other jobs). "
        f"Up to {common.format_size(TURNS_MAX_BYTES)} the rows of a size (ours, MPI's, the "
        "variants, the fresh-data rows and the references) are timed in turns, an untimed "
        "round first, then a batch of each per round, each round in a shuffled order; larger "
        "sizes one row after another. "
        "Sizes as in nccl-tests: an all_gather's or gather's size is its gathered output (each "
        "rank sends size / p; at least one float32 per rank), a reduce_scatter's or scatter's "
        "its input (each rank receives size / p; at least one float32 per rank). "
        "algbw = bytes / time; busbw = algbw x 2(p-1)/p (all_reduce), x (p-1)/p "
        "(all_gather, reduce_scatter, gather, scatter), x 1 (broadcast, reduce), the factors "
        "of nccl-tests' own tests of each. Reduce (SUM), gather and scatter: root rank 0, "
        "the root's gather_list or scatter_list p reused arrays; MPI_Reduce in place on the "
        "root; the algorithm column names what runs: pair (one exchange with the root check) "
        "at p = 2 while each rank's part (a reduce's buffer, a gather's or scatter's block) "
        f"is at most {common.format_size(PAIR_ROOTED_MAX_BYTES)} "
        "(transports.base.PAIR_ROOTED_MAX_BYTES), else the binomial tree. "
        "Speed vs MPI native = MPI "
        "time / our time (> 1: ours is faster). GB/s = 10^9 B/s. Buffer stream (shm jobs, "
        "all_reduce from 1 MiB): every rank reads and writes its own buffer once through a "
        "1 MiB scratch, all ranks at once, timed like an all-reduce and shown with its "
        "bandwidths: the least memory traffic of any all-reduce that leaves its result in "
        "the caller's buffer, so a bound for all of them on this machine. Copy exchange (the "
        "same jobs and sizes): every rank copies its buffer into its area of the shared "
        "workspace and its neighbour's copy back, 1 MiB and one barrier per round: the "
        "copies the direct all-reduce makes at p = 2, without its sums. Shm AVERAGE (shm "
        "jobs, every all_reduce size): the all-reduce with ReduceOp.AVERAGE, as DDP calls "
        "it. Shm plain loop (the same): the SUM all-reduce called in a plain loop with no "
        "barriers, each call timed on its own: what a user timing their own loop sees; in "
        f"the turns, at least {LOOP_TURN_CALLS} such calls a round after a barrier (the "
        "untimed first round its warm-up), above them one loop of all its calls after 10 "
        "untimed ones. Fresh data (broadcast, all_gather and "
        "reduce_scatter, on by default; --no-fresh): every backend's call and MPI's again, "
        "the inputs written before every call (NumPy, inside the timed call): the broadcast's "
        "root fills its whole buffer with the call's index, the readers doing nothing more; "
        "in an all_gather or reduce_scatter every rank fills its whole input with call index "
        "x p + rank; its ratio is against MPI's fresh-data row. The plain rows reuse "
        "unchanged inputs, as osu_bcast, osu_allgather and nccl-tests do, which lets a "
        "single-copy MPI call (Open MPI's CMA) read lines that stay in the peer's cache; a "
        "training step sends freshly computed data. Barrier: dist.barrier, and "
        "MPI_Barrier under mpiexec, timed in batches of calls like the collectives.")
    lines += [SIZE_GOALS_HEADING, "", SIZE_GOALS_NOTE, "", goals_table(size_goals(rows)), "",
              EARLIER_GOALS_HEADING, "", goals_table(earlier_goals(rows)), "",
              runs_line(rows), ""]
    lines += [f"Failed job: {f}" for f in failures]
    lines += ["", tables(rows)]
    return "\n".join(lines)
