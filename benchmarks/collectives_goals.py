"""The goals of ``bench_collectives.py``, each a PASS/MISS line computed from the measured rows.

The goals at every size compare the shm backend with MPI's own collectives measured in the same
run, at p = 2 and p = 4: small-message latency through the public calls, the middle sizes'
bus bandwidth, and what AVERAGE and a plain loop cost beside the batched SUM. A goal spanning
sizes is judged at its worst measured size, which its line names with the figures there and the
sizes it covered; a goal with no measured pair reads "-" (not measured). The earlier goals
(large messages, the 4-byte all-reduce, tcp) stay as documented results.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple

import bench_common as common

NATIVE = "MPI native"
AVERAGE = "shm AVERAGE"     # the shm all-reduce with ReduceOp.AVERAGE (DDP's op)
LOOP = "shm plain loop"     # the shm all-reduce timed call by call, as a user's loop would
BARRIER = "barrier"         # timed without a message: its rows have 0 bytes
KIB, MIB = 1 << 10, 1 << 20
LATENCY_SIZES = (4, KIB)          # latency goals: 4 B - 1 KiB
MIDDLE_SIZES = (4 * KIB, 4 * MIB)  # bandwidth goal: 4 KiB - 4 MiB
LATENCY_SLACK_S = 1e-6            # p = 2: within MPI native + 1 us
LATENCY_FACTOR = 1.5              # p = 4: at most 1.5x MPI native's time
VARIANT_FACTOR = 1.05             # AVERAGE and the plain loop: within 5% of the batched SUM
_TOLERANCE = 1e-9                 # a figure exactly at its limit passes despite rounding

Goal = Tuple[str, str, Optional[bool]]  # (goal, measured, met); met is None: not measured
Pair = Tuple[dict, dict]                # (ours, the row compared with) at one size


def _index(rows: Sequence[dict]) -> Dict[tuple, dict]:
    return {(r["collective"], r["world_size"], r["backend"], r["bytes"]): r for r in rows}


def _pairs(rows: Sequence[dict], collective: str, p: int, ours: str, theirs: str,
           low: int = 0, high: Optional[int] = None) -> List[Pair]:
    """(ours, theirs) at every size from ``low`` to ``high`` bytes where both were measured."""
    index = _index(rows)
    found = []
    for (c, size, backend, nbytes), row in sorted(index.items(), key=lambda kv: kv[0][3]):
        other = index.get((c, size, theirs, nbytes))
        if (c, size, backend) == (collective, p, ours) and other is not None and \
                low <= nbytes <= (nbytes if high is None else high):
            found.append((row, other))
    return found


def _us(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.2f}" if us < 100 else f"{us:.0f}"


def _span(pairs: Sequence[Pair]) -> str:
    sizes = [ours["bytes"] for ours, _ in pairs]
    low, high = common.format_size(sizes[0]), common.format_size(sizes[-1])
    return f"1 size, {low}" if len(sizes) == 1 else f"{len(sizes)} sizes, {low} - {high}"


def _judge(goal: str, pairs: Sequence[Pair], badness: Callable[[dict, dict], float],
           figures: Callable[[dict, dict], str], ok: Callable[[float], bool],
           sized: bool = True) -> Goal:
    """The line of a goal judged at its worst pair (the largest ``badness``)."""
    if not pairs:
        return goal, "-", None
    worst = max(pairs, key=lambda pair: badness(*pair))
    shown = figures(*worst)
    if sized:
        shown = f"worst {common.format_size(worst[0]['bytes'])}: {shown}; {_span(pairs)}"
    return goal, shown, ok(badness(*worst))


def _latency_goals(rows: Sequence[dict], p: int) -> List[Goal]:
    out = []
    for collective in ("all_reduce", "broadcast", BARRIER):
        sized = collective != BARRIER
        span = f" {common.format_size(LATENCY_SIZES[0])} - " \
               f"{common.format_size(LATENCY_SIZES[1])}" if sized else ""
        pairs = _pairs(rows, collective, p, "shm", NATIVE, *(LATENCY_SIZES if sized else (0, 0)))
        if p == 2:  # an absolute slack: what a call adds to MPI's own
            out.append(_judge(
                f"shm {collective}{span} <= MPI native + 1 us, p={p}", pairs,
                lambda a, b: a["seconds"] - b["seconds"],
                lambda a, b: f"{_us(a['seconds'])} vs {_us(b['seconds'])} us "
                             f"({(a['seconds'] - b['seconds']) * 1e6:+.2f} us)",
                lambda excess: excess <= LATENCY_SLACK_S * (1 + _TOLERANCE), sized))
        else:
            out.append(_judge(
                f"shm {collective}{span} <= {LATENCY_FACTOR:g}x MPI native, p={p}", pairs,
                lambda a, b: a["seconds"] / b["seconds"],
                lambda a, b: f"{_us(a['seconds'])} vs {_us(b['seconds'])} us "
                             f"({a['seconds'] / b['seconds']:.2f}x)",
                lambda ratio: ratio <= LATENCY_FACTOR * (1 + _TOLERANCE), sized))
    return out


def _busbw(row: dict) -> float:
    p = row["world_size"]
    return row["bytes"] / row["seconds"] * 2 * (p - 1) / p / 1e9


def _middle_goal(rows: Sequence[dict], p: int) -> Goal:
    low, high = (common.format_size(n) for n in MIDDLE_SIZES)
    return _judge(
        f"shm all_reduce busbw >= 1x MPI native at {low} - {high}, p={p}",
        _pairs(rows, "all_reduce", p, "shm", NATIVE, *MIDDLE_SIZES),
        lambda a, b: a["seconds"] / b["seconds"],  # our time over MPI's: worst is largest
        lambda a, b: f"{_busbw(a):.3g} vs {_busbw(b):.3g} GB/s ({_busbw(a) / _busbw(b):.2f}x)",
        lambda slower: slower <= 1 + _TOLERANCE)


def _variant_goals(rows: Sequence[dict], p: int) -> List[Goal]:
    names = {AVERAGE: f"shm AVERAGE <= {VARIANT_FACTOR:g}x SUM time at every size, p={p}",
             LOOP: f"shm plain loop <= {VARIANT_FACTOR:g}x batched SUM time at every size, p={p}"}
    return [_judge(goal, _pairs(rows, "all_reduce", p, variant, "shm"),
                   lambda a, b: a["seconds"] / b["seconds"],
                   lambda a, b: f"{_us(a['seconds'])} vs {_us(b['seconds'])} us "
                                f"({a['seconds'] / b['seconds']:.2f}x)",
                   lambda ratio: ratio <= VARIANT_FACTOR * (1 + _TOLERANCE))
            for variant, goal in names.items()]


def size_goals(rows: Sequence[dict]) -> List[Goal]:
    """Latency (4 B - 1 KiB), the middle sizes' busbw (4 KiB - 4 MiB), then AVERAGE and the
    plain loop against the batched SUM: the shm backend beside MPI native, p = 2 and 4."""
    return ([g for p in (2, 4) for g in _latency_goals(rows, p)]
            + [_middle_goal(rows, p) for p in (2, 4)]
            + [g for p in (2, 4) for g in _variant_goals(rows, p)])


def earlier_goals(rows: Sequence[dict]) -> List[Goal]:
    """Large all-reduces against MPI native, the 4-byte all-reduce, tcp's bandwidth."""
    index, out = _index(rows), []
    for p, factor in ((2, 2.0), (4, 1.0)):
        for size in (16 * MIB, 64 * MIB):
            ours = index.get(("all_reduce", p, "shm", size))
            native = index.get(("all_reduce", p, NATIVE, size))
            goal = (f"shm all_reduce busbw >= {factor:g}x MPI native at "
                    f"{common.format_size(size)}, p={p}")
            if ours is None or native is None:
                out.append((goal, "-", None))
                continue
            mine, theirs = _busbw(ours), _busbw(native)
            out.append((goal, f"{mine:.3g} vs {theirs:.3g} GB/s ({mine / theirs:.2f}x)",
                        mine >= factor * theirs))
    tiny = index.get(("all_reduce", 2, "shm", 4))
    out.append(("shm 4-byte all_reduce <= 8 us, p=2",
                "-" if tiny is None else f"{tiny['seconds'] * 1e6:.2f} us",
                None if tiny is None else tiny["seconds"] <= 8e-6))
    tcp = index.get(("all_reduce", 2, "tcp", 64 * MIB))
    out.append(("tcp all_reduce busbw >= 1.5 GB/s at 64 MiB, p=2",
                "-" if tcp is None else f"{_busbw(tcp):.3g} GB/s",
                None if tcp is None else _busbw(tcp) >= 1.5))
    return out


def goals(rows: Sequence[dict]) -> List[Goal]:
    """Every goal line, the goals at every size first."""
    return size_goals(rows) + earlier_goals(rows)


def goals_table(goal_lines: Sequence[Goal]) -> str:
    return common.markdown_table(["goal", "measured", "result"],
                                 [[g, m, common.verdict(ok)] for g, m, ok in goal_lines], "llr")


def summary(rows: Sequence[dict]) -> str:
    """One plain line per goal, the verdict first: what a run prints last."""
    width = max(len(common.verdict(ok)) for _, _, ok in goals(rows))
    return "\n".join(f"{common.verdict(ok):<{width}}  {goal}: {measured}"
                     for goal, measured, ok in goals(rows))
