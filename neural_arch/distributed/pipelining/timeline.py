"""A schedule's timeline: which pass ran when on which stage, as data, a trace and a picture.

Times are ``time.perf_counter()`` seconds. On Linux that is CLOCK_MONOTONIC, one clock for all
processes of a machine, so events of different stages line up without any clock exchange
(across machines they would not; the per-stage busy and idle times stay meaningful).

The bubble is the time a stage sits idle between the first pass of the step on any stage and
the last pass on any stage: ``bubble_fraction`` averages idle/total over the stages. GPipe's
is about ``(p - 1) / (m + p - 1)`` when passes take equal time: large for one micro-batch,
smaller with many.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Iterable, List, NamedTuple, Optional


class Event(NamedTuple):
    """One pass: ``stage`` (pipeline rank), ``action`` "F" or "B", ``microbatch``, ``chunk``
    (the rank's model chunk: its virtual stage is ``chunk * p + stage``), ``start``/``end``."""

    stage: int
    action: str
    microbatch: int
    chunk: int
    start: float
    end: float


def gather_events(events: List[Event], group: Any) -> List[Event]:
    """Every stage's events on every stage (a collective over ``group``), sorted by start."""
    from ..collectives import all_gather_object
    rows = all_gather_object([tuple(e) for e in events], group=group)
    return sorted((Event(*row) for part in rows for row in part), key=lambda e: e.start)


def _by_stage(events: Iterable[Event]) -> Dict[int, List[Event]]:
    stages: Dict[int, List[Event]] = {}
    for event in sorted(events, key=lambda e: e.start):
        stages.setdefault(event.stage, []).append(event)
    return stages


def bubble_fraction(events: List[Event]) -> float:
    """Idle time over the step's span, per stage, averaged over the stages (0: never idle)."""
    if not events:
        raise ValueError("bubble_fraction needs at least one event")
    t0 = min(e.start for e in events)
    span = max(e.end for e in events) - t0
    if span <= 0:
        return 0.0
    fractions = []
    for stage_events in _by_stage(events).values():
        busy = sum(e.end - e.start for e in stage_events)
        fractions.append(max(0.0, span - busy) / span)
    return sum(fractions) / len(fractions)


def chrome_trace(events: List[Event]) -> dict:
    """The events as a Chrome / Perfetto trace (``traceEvents``, complete events in us)."""
    t0 = min((e.start for e in events), default=0.0)
    trace = [{"name": f"{e.action}{e.microbatch}" + (f".{e.chunk}" if e.chunk else ""),
              "cat": "forward" if e.action == "F" else "backward", "ph": "X",
              "ts": (e.start - t0) * 1e6, "dur": (e.end - e.start) * 1e6,
              "pid": e.stage, "tid": e.stage,
              "args": {"microbatch": e.microbatch, "chunk": e.chunk}} for e in events]
    trace += [{"name": "process_name", "ph": "M", "pid": stage, "tid": stage,
               "args": {"name": f"stage {stage}"}} for stage in sorted({e.stage for e in events})]
    return {"traceEvents": trace, "displayTimeUnit": "ms"}


def write_chrome_trace(events: List[Event], path: str) -> str:
    """Write ``chrome_trace(events)`` as JSON to ``path`` (open in Perfetto or
    chrome://tracing); returns ``path``."""
    with open(path, "w") as f:
        json.dump(chrome_trace(events), f)
    return path


def plot_timeline(events: List[Event], path: str, title: Optional[str] = None) -> str:
    """A PNG of the timeline: one row per stage, boxes labeled by micro-batch (and chunk),
    forwards and backwards in different colors, idle time shaded. Needs matplotlib (a dev
    extra), imported here only."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError as e:
        raise ImportError(f"plot_timeline needs matplotlib (pip install matplotlib): {e}") from e
    if not events:
        raise ValueError("plot_timeline needs at least one event")
    t0 = min(e.start for e in events)
    t1 = max(e.end for e in events)
    stages = _by_stage(events)
    colors = {"F": ["#4C72B0", "#8FAADC"], "B": ["#DD8452", "#F4B183"]}
    fig, ax = plt.subplots(figsize=(max(6.0, 0.45 * len(events) / max(1, len(stages))),
                                    0.6 * len(stages) + 1.2))
    for stage, stage_events in stages.items():
        ax.broken_barh([(0.0, (t1 - t0) * 1e3)], (stage - 0.4, 0.8), color="#E0E0E0")
        for e in stage_events:
            left, width = (e.start - t0) * 1e3, (e.end - e.start) * 1e3
            ax.broken_barh([(left, width)], (stage - 0.4, 0.8),
                           color=colors[e.action][e.chunk % 2], edgecolor="black", linewidth=0.3)
            label = f"{e.microbatch}" + (f".{e.chunk}" if e.chunk else "")
            ax.text(left + width / 2, stage, label, ha="center", va="center", fontsize=7)
    ax.set_yticks(sorted(stages))
    ax.set_yticklabels([f"stage {s}" for s in sorted(stages)])
    ax.invert_yaxis()
    ax.set_xlabel("time (ms)")
    ax.set_title(title or f"pipeline timeline (bubble {bubble_fraction(events):.0%})")
    ax.legend(handles=[Patch(color=colors["F"][0], label="forward"),
                       Patch(color=colors["B"][0], label="backward"),
                       Patch(color="#E0E0E0", label="idle")], loc="upper right", fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
