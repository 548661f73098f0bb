#!/usr/bin/env python
"""Inject every fault the framework is meant to survive, measure it, and print each row.

    python scripts/fault_injection_report.py [--runs N] [--only PATTERN] [--doc [PATH]]
                                             [--json out.json]

Faults: SIGKILL of the first, a middle and the last rank mid-all-reduce, SIGSTOP (a hung
rank, the store host included), a socket closed under a collective (tcp), on shm and tcp with 3
ranks; under MPI, a stopped rank on one host and, with a pid namespace per rank standing in for
other hosts, a stopped rank and a killed one (``--with-ft ulfm``); a network link cut between
two nodes (network namespaces, root only); a truncated checkpoint and a corrupted one; SIGTERM
mid-epoch and the resumed run; a worker killed under ``--max_restarts``; the launcher killed
with SIGKILL under workers in all-reduce, on shm and tcp; a rank killed outside the subgroup
that all-reduces, the store host stopped right after init, and ranks that each name another
broadcast root, on shm and tcp; ranks asking for different backends; 500 idle connections at
the store and the data ports; a damaged checkpoint named by path; loads while another process
saves (``fault_rows_inputs``); one tensor-parallel rank's newest checkpoint damaged before
``--resume`` (``fault_rows_resume``); Horovod named operations submitted in a different order on
every rank (``fault_rows_horovod``); two ``train_gpt`` runs in one ``--out-dir``
(``fault_rows_train_gpt``); a rank waiting for a store that never answers
(``fault_rows_rendezvous``); a RayTrainer worker SIGKILLed mid-epoch (``fault_rows_ray``).

Every fault is injected ``--runs`` times (3 by default), each time into fresh processes. A row
gives the measured time as min / median / max over the runs, what the runs left behind
(processes still running, /dev/shm segments; see ``fault_leftovers``) and the outcome. A row
passes when every run had the expected outcome within ``DETECT_LIMIT_S`` and left nothing.
``--only PATTERN`` measures only the rows whose "fault [backend]" matches the regular
expression. Each row is printed as soon as it is measured. Only with ``--doc`` does the table
replace the part of a document between its markers (``docs/fault-tolerance.md`` when no path is
given; the rest is left as written): the tracked document changes only when asked to.

A row is one ``Fault``: its label, backend, world size, and a runner (``fault_rows``) that
injects the fault once into a fresh scratch directory and returns a ``Run``. To add one, add
a line to ``faults()``.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Callable, List, Optional

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# The helpers (fault_injection_job, fault_injector, dist_harness) are in tests/; the test
# modules some rows reuse are in the folders of what they test: test_heartbeat and
# test_mpi_heartbeat in distributed/health, test_multinode_netns in distributed/launch.
for _path in (ROOT, TESTS, TESTS / "distributed" / "health", TESTS / "distributed" / "launch"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import fault_rows as rows  # noqa: E402
import fault_rows_horovod as horovod_rows  # noqa: E402
import fault_rows_inputs as inputs  # noqa: E402
import fault_rows_mpi as mpi_rows  # noqa: E402
import fault_rows_ray as ray_rows  # noqa: E402
import fault_rows_rendezvous as rendezvous_rows  # noqa: E402
import fault_rows_resume as resume_rows  # noqa: E402
import fault_rows_train_gpt as train_gpt_rows  # noqa: E402
import fault_rows_tune as tune_rows  # noqa: E402
from fault_leftovers import Leftovers  # noqa: E402
from fault_rows import Run  # noqa: E402

BEGIN, END = "<!-- fault-table:begin -->", "<!-- fault-table:end -->"
DETECT_LIMIT_S = 10.0
DOC = ROOT / "docs" / "fault-tolerance.md"


@dataclass(frozen=True)
class Fault:
    """One row: the fault, where it is injected, and the runner that injects it once."""
    label: str
    backend: str
    world_size: int
    run: Callable[[Path], Run]

    @property
    def name(self) -> str:
        return f"{self.label} [{self.backend}]"


def faults() -> List[Fault]:
    """Every row, in the order of the table."""
    collective = rows.collective
    table = [Fault(f"SIGKILL rank {victim} ({where}) mid-all-reduce", backend, 3,
                   partial(collective, "kill", backend, victim))
             for backend in ("tcp", "shm")
             for victim, where in ((0, "first"), (1, "middle"), (2, "last"))]
    table += [
        Fault("SIGSTOP rank 1 (hung)", "tcp", 3, partial(collective, "stop", "tcp", 1)),
        Fault("SIGSTOP rank 0 (hung store host)", "tcp", 3, partial(collective, "stop", "tcp", 0)),
        Fault("SIGSTOP rank 1 (hung)", "shm", 3, partial(collective, "stop", "shm", 1)),
        Fault("socket closed under all-reduce", "tcp", 3,
              partial(collective, "close_socket", "tcp", 1)),
        Fault("SIGSTOP rank 1 (hung)", "mpi", 3, mpi_rows.stop_on_one_host),
        Fault("SIGSTOP rank 1, ranks out of pid sight (hung)", "mpi", 3,
              partial(mpi_rows.out_of_pid_sight, "SIGSTOP", False, "the heartbeat store")),
        Fault("SIGKILL rank 1, ranks out of pid sight, --with-ft ulfm", "mpi", 3,
              partial(mpi_rows.out_of_pid_sight, "SIGKILL", True, "MPI's failure report")),
        Fault("link cut between 2 nodes mid-run", "tcp", 4, rows.netns_link_cut),
        Fault("truncated checkpoint file", "-", 1,
              partial(rows.damaged_checkpoint, rows.truncate)),
        Fault("corrupted checkpoint (checksum)", "-", 1,
              partial(rows.damaged_checkpoint, rows.flip_byte)),
        Fault("SIGTERM mid-epoch, then resume", "shm", 2, rows.sigterm_then_resume),
        Fault("worker SIGKILLed, --max_restarts=1", "shm", 2, rows.worker_killed_restart),
    ]
    table += [Fault("launcher SIGKILLed under workers in all-reduce", backend, 2,
                    partial(rows.launcher_killed, backend)) for backend in ("shm", "tcp")]
    for backend in ("shm", "tcp"):
        table += [
            Fault("SIGKILL rank 2, outside the all-reducing subgroup [0, 1]", backend, 3,
                  partial(collective, "kill", backend, 2, group=[0, 1])),
            Fault("SIGSTOP rank 0 (store host) right after init", backend, 3,
                  partial(collective, "stop_early", backend, 0)),
            Fault("each rank a different broadcast root", backend, 3,
                  partial(inputs.root_mismatch, backend)),
        ]
    table += [
        Fault("ranks ask for different backends (shm, tcp, tcp)", "-", 3, inputs.mixed_backends),
        Fault("500 idle connections at the store and data ports", "tcp", 4, inputs.idle_flood),
        Fault("truncated checkpoint named by path", "-", 1,
              partial(inputs.named_damaged_checkpoint, rows.truncate)),
        Fault("corrupted checkpoint named by path", "-", 1,
              partial(inputs.named_damaged_checkpoint, rows.flip_byte)),
        Fault("loads while another process saves", "-", 1, inputs.loads_during_saves),
    ]
    table += [Fault("one tensor-parallel rank's newest checkpoint corrupted, --resume", "shm", 2,
                    resume_rows.tp_rank_checkpoint_damaged)]
    table += [Fault("Horovod named ops submitted in different orders", "shm", 3,
                    horovod_rows.named_orders)]
    table += [Fault("two train_gpt runs in one --out-dir", "-", 1,
                    train_gpt_rows.two_runs_one_out_dir)]
    table += [Fault("rank waiting for a store that never answers", "tcp", 2,
                    rendezvous_rows.store_never_answers)]
    table += [Fault("Ray worker SIGKILLed mid-epoch, max_failures=1", "shm", 2,
                    ray_rows.worker_killed)]
    table += [Fault("tuner SIGKILLed mid-study, then resumed", "shm", 1,
                    tune_rows.killed_then_resumed),
              Fault("a tuner's trial raises", "shm", 1, tune_rows.trial_raises)]
    return table


# ----- measuring a row ------------------------------------------------------------------------
def run_once(fault: Fault) -> tuple:
    """(Run, what it left behind) of one injection, in a fresh scratch directory."""
    with Leftovers() as watch, tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
        try:
            run = fault.run(Path(tmp))
        except Exception as exc:  # a runner that breaks fails its row, not the whole report
            run = Run(None, False, f"the runner raised {type(exc).__name__}: {exc}")
        return run, watch.collect(run.pids)


def _by_run(texts: List[str]) -> str:
    """The text when every run agrees; otherwise each distinct text with the runs that gave it."""
    distinct = list(dict.fromkeys(texts))
    if len(distinct) == 1:
        return distinct[0]
    parts = []
    for text in distinct:
        numbers = [str(i + 1) for i, t in enumerate(texts) if t == text]
        parts.append(f"run{'s' if len(numbers) > 1 else ''} {', '.join(numbers)}: {text}")
    return "; ".join(parts)


def _run_text(run: Run) -> str:
    if run.seconds is not None and run.seconds > DETECT_LIMIT_S:
        return f"{run.outcome} (after {run.seconds:.1f} s, over the {DETECT_LIMIT_S:g} s limit)"
    return run.outcome


def summarize(fault: Fault, results: list) -> dict:
    """The row of ``fault`` from its runs: times, leftovers, outcome, pass or fail."""
    measured = sorted(run.seconds for run, _ in results if run.seconds is not None)
    seconds = None if not measured else {
        "min": round(measured[0], 3), "median": round(statistics.median(measured), 3),
        "max": round(measured[-1], 3)}
    ok = all(run.ok and run.seconds is not None and run.seconds <= DETECT_LIMIT_S and not left
             for run, left in results)
    return {"fault": fault.label, "backend": fault.backend, "world_size": fault.world_size,
            "runs": len(results), "measured_runs": len(measured), "seconds": seconds, "ok": ok,
            "left": _by_run([", ".join(left) or "nothing" for _, left in results]),
            "outcome": _by_run([_run_text(run) for run, _ in results]),
            "each_run": [{"seconds": run.seconds, "ok": run.ok, "outcome": run.outcome,
                          "left": left} for run, left in results]}


def measure(fault: Fault, runs: int, progress=print) -> dict:
    results = []
    for i in range(runs):
        run, left = run_once(fault)
        results.append((run, left))
        progress(f"    run {i + 1} of {runs}: "
                 f"{'-' if run.seconds is None else f'{run.seconds:.3f}'} s, "
                 f"left {', '.join(left) or 'nothing'}", flush=True)
        if run.not_run:
            break  # nothing to repeat
    return summarize(fault, results)


# ----- the report -----------------------------------------------------------------------------
def times(row: dict) -> str:
    s = row["seconds"]
    if s is None:
        return "-"
    text = f"{s['min']:.3f} / {s['median']:.3f} / {s['max']:.3f}"
    if row["measured_runs"] < row["runs"]:
        text += f" ({row['measured_runs']} of {row['runs']} runs)"
    return text


def print_row(row: dict) -> None:
    print(f"{'ok ' if row['ok'] else 'FAILED'} {row['fault']} [{row['backend']}, "
          f"{row['world_size']}]: {times(row)} s; left {row['left']}; {row['outcome']}",
          flush=True)


def selected(pattern: Optional[str]) -> List[Fault]:
    chosen = faults()
    if pattern is not None:
        wanted = re.compile(pattern, re.I)
        chosen = [f for f in chosen if wanted.search(f.name)]
    return chosen


def run_all(runs: int = 3, only: Optional[str] = None, report=print_row) -> list:
    """Measure every row (or those matching ``only``), reporting each as soon as it is done."""
    rows_done = []
    for fault in selected(only):
        rows_done.append(measure(fault, runs))
        report(rows_done[-1])
    return rows_done


def table(rows_done: list, command: str, runs: int) -> str:
    lines = [BEGIN, f"Made by `{command}` on {time.strftime('%Y-%m-%d')} ({platform.machine()}, "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}), {runs} runs per "
             f"row. Passed {sum(r['ok'] for r in rows_done)} of {len(rows_done)}.", "",
             "| fault | backend | world size | time (s): min / median / max | left behind | "
             "outcome |",
             "|---|---|---|---|---|---|"]
    for r in rows_done:
        mark = "ok" if r["ok"] else "**FAILED**"
        lines.append(f"| {r['fault']} | {r['backend']} | {r['world_size']} | {times(r)} | "
                     f"{r['left']} | {mark}: {r['outcome']} |")
    return "\n".join(lines + [END])


def write_table(doc: Path, text: str) -> None:
    current = doc.read_text() if doc.exists() else f"# Fault tolerance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in current or END not in current:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} markers to replace")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    doc.write_text(pattern.sub(lambda _: text, current, count=1))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--runs", type=int, default=3,
                        help="injections of each fault; a row gives min / median / max of them")
    parser.add_argument("--only", metavar="PATTERN",
                        help="measure only the rows whose 'fault [backend]' matches this "
                             "regular expression (case-insensitive)")
    parser.add_argument("--doc", type=Path, nargs="?", const=DOC, default=None,
                        help=f"write the table into this document's markers (no path: {DOC}); "
                             "without the option no file is written")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be at least 1, got {args.runs}")
    if args.only is not None:
        try:
            re.compile(args.only)
        except re.error as exc:
            parser.error(f"--only {args.only!r} is not a regular expression: {exc}")
        if not selected(args.only):
            parser.error(f"--only {args.only!r} matches no row; rows: "
                         + "; ".join(f.name for f in faults()))
        if args.doc is not None:
            parser.error("--doc writes the whole table; it cannot be combined with --only")
    done = run_all(args.runs, args.only)
    passed = sum(r["ok"] for r in done)
    if args.doc is not None:
        command = "python scripts/fault_injection_report.py" + "".join(
            f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
        write_table(args.doc, table(done, command, args.runs))
        print(f"passed {passed} of {len(done)}; table written to {args.doc}", flush=True)
    else:
        print(f"passed {passed} of {len(done)}; no document written (--doc writes the table "
              f"into {DOC.relative_to(ROOT)})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(done, indent=2))
    return 0 if passed == len(done) else 1


if __name__ == "__main__":
    sys.exit(main())
