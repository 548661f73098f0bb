#!/usr/bin/env python
"""Validate distributed training end to end on N real processes.

    python scripts/validate_distributed_training.py --backend shm --world-size 4 --output report.json

Two launches of this same script in worker mode: the main run (environment, every collective,
DDP equivalence, sampling, checkpoint/resume) and a fault run in which the last rank SIGKILLs
itself inside a loop of all-reduces. shm, tcp, auto and gloo start through
``launch_distributed_training``; mpi through ``mpiexec`` (see validation_launch.py). Each rank
writes its verdicts to a temporary directory and a check passes only if it passed on every
rank. Prints one line per check and an overall line, writes the JSON report (and says where),
and exits 0 only if every check passed. Checks that could not run here (mpi without mpiexec or
mpi4py) are SKIPPED, with the reason, not FAILED.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional, Sequence

SCRIPT = Path(__file__).resolve()
for _path in (SCRIPT.parent, SCRIPT.parents[1]):  # the helpers, and the package itself
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from validation_checks import (FAILED, FAULT_CHECK, FAULT_DETECTION_LIMIT_S,  # noqa: E402
                               FAULT_ITERATIONS, INJECT_VAR, PASSED, SKIPPED, Context,
                               check_list, injected_faults, run_fault, run_main)
from validation_launch import Launch, launch_local, launch_mpi  # noqa: E402

BACKENDS = ("shm", "tcp", "mpi", "auto", "gloo")
FAULT_PG_TIMEOUT_S = 30.0  # longer than the detection limit: a timeout is no detection


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n", 2)[0] + "\n\n" + __doc__.split("\n\n", 2)[2],
        formatter_class=_HelpFormatter,
        epilog="Each check prints PASSED, FAILED or SKIPPED (could not run here, with the "
               "reason).\nExit status: 0 when every check passed, 1 otherwise, 2 for bad "
               "arguments.")
    parser.add_argument("--backend", choices=BACKENDS, default="auto",
                        help="the backend to validate; mpi starts the ranks with mpiexec (from "
                             "PATH, else next to this Python)")
    parser.add_argument("--world-size", type=int, default=2, help="processes to start (>= 2)")
    parser.add_argument("--output", default="distributed_validation.json",
                        help="where to write the JSON report (relative to the current "
                             "directory); its full path is printed at the end")
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="seconds each of the two launches may take before it is stopped")
    parser.add_argument("--worker", choices=("main", "fault"), help=argparse.SUPPRESS)
    parser.add_argument("--work-dir", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker and not args.work_dir:
        parser.error("--worker needs --work-dir")
    if args.world_size < 2:
        parser.error(f"--world-size must be >= 2 to exercise communication, got "
                     f"{args.world_size}")
    if not args.timeout > 0:
        parser.error(f"--timeout must be > 0 seconds, got {args.timeout}")
    try:
        injected_faults(os.environ.get(INJECT_VAR))
    except ValueError as e:
        parser.error(str(e))
    return args


# ----- worker mode -----------------------------------------------------------------------------
def rank_from_environment() -> int:
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if os.environ.get(name, "").strip():
            return int(os.environ[name])
    raise ValueError("worker mode needs RANK (launcher) or OMPI_COMM_WORLD_RANK (mpiexec) in "
                     "the environment")


def worker_main(args: argparse.Namespace) -> int:
    work = Path(args.work_dir)
    ctx = Context(rank_from_environment(), args.world_size, args.backend, work,
                  os.environ.get(INJECT_VAR) or None)
    (work / f"{args.worker}_pid{ctx.rank}").write_text(str(os.getpid()))
    if args.worker == "fault":
        return run_fault(ctx, args.backend, FAULT_PG_TIMEOUT_S)
    return run_main(ctx, args.backend, max(5.0, min(60.0, args.timeout / 3)))


# ----- merging the ranks' verdicts -------------------------------------------------------------
def read_json(path: Path) -> Optional[dict]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def last_log_line(launch: Launch, rank: int) -> str:
    """The end of what the rank (or mpiexec, which words its notes over two lines) printed."""
    for path, keep in ((launch.logs / f"rank_{rank}.log", 1), (launch.logs / "mpiexec.log", 2)):
        with contextlib.suppress(OSError):
            lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines()
                     if re.search(r"\w", ln)]
            if lines:
                return f"; last output: {' '.join(lines[-keep:])[-240:]}"
    return ""


def no_result(launch: Launch, rank: int) -> str:
    return f"no result ({launch.note}{last_log_line(launch, rank)})"


def combine(reasons: dict[int, str]) -> str:
    """``ranks 0, 2: why; rank 1: other`` -- ranks with the same reason share one entry."""
    by_reason: dict[str, list[int]] = {}
    for rank, reason in sorted(reasons.items()):
        by_reason.setdefault(reason, []).append(rank)
    return "; ".join(f"rank{'s' if len(r) > 1 else ''} {', '.join(map(str, r))}: {why}"
                     for why, r in by_reason.items())


def skipped_check(name: str, launch: Launch) -> dict:
    return {"name": name, "status": SKIPPED, "seconds": 0.0,
            "details": f"not run: {launch.skipped}"}


def merge_main(work: Path, n: int, launch: Launch) -> list[dict]:
    if launch.skipped:
        return [skipped_check(name, launch) for name, _ in check_list()]
    verdicts = {}
    for rank in range(n):
        found = read_json(work / f"main_rank{rank}.json") or {"checks": []}
        verdicts[rank] = {c["name"]: c for c in found["checks"]}
    checks = []
    for name, _ in check_list():
        entries = {r: verdicts[r].get(name) for r in range(n)}
        failures = {r: no_result(launch, r) if e is None else e["details"]
                    for r, e in entries.items() if e is None or e["status"] != PASSED}
        seconds = max([e["seconds"] for e in entries.values() if e] or [0.0])
        details = combine(failures) if failures else entries[0]["details"]
        checks.append({"name": name, "status": FAILED if failures else PASSED,
                       "seconds": round(seconds, 3), "details": details})
    return checks


def fault_check(work: Path, n: int, launch: Launch) -> dict:
    if launch.skipped:
        return skipped_check(FAULT_CHECK, launch)
    victim = n - 1
    kill = read_json(work / "fault_kill.json")
    problems, seen = {}, {}
    if kill is None:
        problems[victim] = f"did not SIGKILL itself ({launch.note})"
    for rank in range(victim):
        got = read_json(work / f"fault_rank{rank}.json")
        named = got and (got.get("peer") == victim
                         or re.search(rf"\brank {victim}\b", got.get("message") or ""))
        if got is None:
            problems[rank] = no_result(launch, rank)
        elif got["error"] is None:
            problems[rank] = f"no error after {got.get('iterations')} all_reduces"
        elif not got["is_distributed_error"] or not named:
            problems[rank] = (f"{got['error']} is not a DistributedError naming rank {victim}: "
                              f"{got['message']}")
        elif kill is not None:
            delay = got["time"] - kill["time"]
            if delay > FAULT_DETECTION_LIMIT_S:
                problems[rank] = (f"noticed after {delay:.2f} s (limit "
                                  f"{FAULT_DETECTION_LIMIT_S:g} s): {got['message']}")
            seen[rank] = (delay, got["error"], got["message"])
    status = FAILED if problems else PASSED
    if problems:
        details = combine(problems)
    else:
        errors = sorted({e for _, e, _ in seen.values()})
        details = (f"rank {victim} SIGKILLed in a loop of {FAULT_ITERATIONS} all_reduces; "
                   f"ranks {sorted(seen)} raised {'/'.join(errors)} naming it within "
                   f"{max(d for d, _, _ in seen.values()):.3f} s; {launch.note}; rank 0 said: "
                   f"{seen[0][2]}")
    return {"name": FAULT_CHECK, "status": status, "seconds": round(launch.seconds, 3),
            "details": details}


# ----- the parent ------------------------------------------------------------------------------
def validate(args: argparse.Namespace) -> int:
    launch = launch_mpi if args.backend == "mpi" else launch_local
    work = Path(tempfile.mkdtemp(prefix="nf_validate_"))
    print(f"Validating backend {args.backend!r} on {args.world_size} processes", flush=True)
    try:
        checks = merge_main(work, args.world_size, launch("main", args, work))
        for check in checks:
            print_check(check)
        fault = fault_check(work, args.world_size, launch("fault", args, work))
        print_check(fault)
        checks.append(fault)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    counts = {status: sum(c["status"] == status for c in checks)
              for status in (PASSED, FAILED, SKIPPED)}
    # Failures outrank skips: a run with both is FAILED.
    overall = FAILED if counts[FAILED] else SKIPPED if counts[SKIPPED] else PASSED
    skipped = f", {counts[SKIPPED]} skipped" if counts[SKIPPED] else ""
    print(f"OVERALL: {overall} ({counts[PASSED]}/{len(checks)} checks passed{skipped})",
          flush=True)
    report = {"overall": overall, "passed": counts[PASSED], "failed": counts[FAILED],
              "skipped": counts[SKIPPED], "backend": args.backend,
              "world_size": args.world_size, "checks": checks}
    output = Path(args.output).absolute()
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"JSON report: {output}", flush=True)
    return 0 if overall == PASSED else 1


def print_check(check: dict) -> None:
    print(f"{check['status']}  {check['name']}  ({check['seconds']:.2f} s)  {check['details']}",
          flush=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    return worker_main(args) if args.worker else validate(args)


if __name__ == "__main__":
    sys.exit(main())
