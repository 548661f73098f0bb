"""The tables, goals and plot of ``distributed_training_benchmark.py``, from its measured rows.

A row is one model trained at one world size, backend and sync mode (``manual``: the whole
all-reduce in ``sync_gradients()``; ``auto``: buckets reduced during backward), with the
slowest rank's median step time and time in ``sync_gradients()``, in seconds. The single-process
row (world size 1, backend ``-``) is the baseline of every efficiency.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import bench_common as common
from bench_common import model_name
from collectives_report import tables as collective_tables

GOAL_MODEL = [784, 1024, 1024, 10]
GOAL_EFFICIENCY = 0.90
MODES = ("manual", "auto")


def _find(rows: Sequence[dict], model: str, p: int, backend: str, mode: str) -> Optional[dict]:
    for row in rows:
        if (row["model"], row["world_size"], row["mode"]) == (model, p, mode) and \
                (p == 1 or row["backend"] == backend):
            return row
    return None


def efficiency(rows: Sequence[dict], row: dict) -> Optional[float]:
    single = _find(rows, row["model"], 1, "-", "manual")
    return None if single is None else single["step"] / row["step"]


def _params(count: int) -> str:
    return f"{count / 1e6:.1f}M" if count >= 100_000 else f"{count / 1e3:.0f}K"


def _pct(value: Optional[float]) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def training_table(rows: Sequence[dict]) -> str:
    body = []
    rank_of = {"-": 0, "shm": 1, "tcp": 2, "mpi": 3}
    ordered = sorted(rows, key=lambda r: (r["params"], r["world_size"],
                                          rank_of.get(r["backend"], 9)))
    for row in (r for r in ordered if r["mode"] == "manual"):
        auto = _find(rows, row["model"], row["world_size"], row["backend"], "auto")
        cells = [f"{row['model']} ({_params(row['params'])})", row["backend"],
                 str(row["world_size"]), str(row["batch"]), _ms(row["step"]),
                 _ms(row["sync"]), _pct(row["sync"] / row["step"]),
                 _pct(efficiency(rows, row))]
        if auto is None:
            cells += ["-"] * 4
        else:
            cells += [_ms(auto["step"]), _pct(auto["sync"] / auto["step"]),
                      _pct(efficiency(rows, auto)), f"{row['step'] / auto['step']:.2f}x"]
        body.append(cells)
    header = ["model (params)", "backend", "p", "batch/rank", "manual step (ms)",
              "manual sync (ms)", "manual comm share", "manual efficiency", "auto step (ms)",
              "auto comm share", "auto efficiency", "auto gain"]
    return common.markdown_table(header, body, "llrrrrrrrrrr")


def goals(rows: Sequence[dict], backends: Sequence[str]) -> List[Tuple[str, str, Optional[bool]]]:
    name, out = model_name(GOAL_MODEL), []
    for backend in backends:
        for mode in MODES:
            row = _find(rows, name, 2, backend, mode)
            value = None if row is None or row["batch"] != 256 else efficiency(rows, row)
            out.append((f"weak-scaling efficiency >= {GOAL_EFFICIENCY:.0%}, {name}, batch 256 "
                        f"per rank, p=2, {backend}, {mode} sync", _pct(value),
                        None if value is None else value >= GOAL_EFFICIENCY))
    return out


def plot(rows: Sequence[dict], path: str) -> None:
    plt = common.pyplot()
    models = sorted({(r["params"], r["model"]) for r in rows})
    if not models:
        return
    columns = min(2, len(models))
    fig, axes = plt.subplots(-(-len(models) // columns), columns, squeeze=False, sharey=True,
                             figsize=(5.5 * columns, 3.8 * -(-len(models) // columns)))
    colours = {"shm": "tab:blue", "tcp": "tab:orange", "mpi": "tab:green"}
    for ax, (params, name) in zip(axes.flat, models):
        for backend, colour in colours.items():
            for mode, style in (("manual", "-"), ("auto", "--")):
                points = [(1, 1.0)] if _find(rows, name, 1, "-", "manual") else []
                points += sorted((r["world_size"], efficiency(rows, r)) for r in rows
                                 if (r["model"], r["backend"], r["mode"]) == (name, backend, mode)
                                 and efficiency(rows, r) is not None)
                if len(points) > 1:
                    ax.plot(*zip(*points), style, color=colour, marker="o",
                            label=f"{backend}, {mode} sync")
        ax.axhline(GOAL_EFFICIENCY, color="grey", linewidth=0.8, linestyle=":")
        ax.set_title(f"{name} ({_params(params)} parameters)", fontsize=9)
        ax.set_xlabel("world size (ranks), batch per rank fixed")
        ax.set_ylabel("efficiency t(1)/t(p)")
        ax.set_xticks(sorted({r["world_size"] for r in rows}))
        ax.grid(True, alpha=0.3)
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    axes.flat[0].legend(fontsize=8)
    fig.tight_layout()
    common.save_figure(fig, path)


def report(reduce_rows, train_rows, failures, backends, command: str, machine: str) -> str:
    goal_rows = [[g, m, common.verdict(ok)] for g, m, ok in goals(train_rows, backends)]
    lines = common.section_head(
        "Distributed training (`benchmarks/distributed_training_benchmark.py`)", command,
        machine, "MLP + cross-entropy + SGD under DistributedDataParallel (25 MiB buckets), a fixed "
             "batch per rank, one BLAS thread per rank. Step time: slowest rank's median. "
             "Efficiency: t(1)/t(p) (weak scaling). Comm share: time in sync_gradients() / "
             "step (with auto sync, only the part not hidden behind backward). Auto gain: "
        "manual step time / auto step time.")
    lines += ["### Goal", "", common.markdown_table(["goal", "measured", "result"], goal_rows,
                                                    "llr"), ""]
    lines += [f"Failed job: {f}" for f in failures]
    lines += ["", "### Training step and weak scaling", "", training_table(train_rows)]
    if reduce_rows:
        lines += ["", "### All-reduce (from `bench_collectives.py`)", "",
                  collective_tables(reduce_rows).replace("### ", "#### ")]
    return "\n".join(lines)
