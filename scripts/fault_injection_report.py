#!/usr/bin/env python
"""Inject every fault the framework is meant to survive, measure it, and print each row.

    python scripts/fault_injection_report.py [--doc [PATH]] [--json out.json]

Faults: SIGKILL of the first, a middle and the last rank mid-all-reduce, SIGSTOP (a hung
rank, the store host included), a socket closed under a collective (tcp), on shm and tcp with 3
ranks; under MPI, a stopped rank on one host and, with a pid namespace per rank standing in for
other hosts, a stopped rank and a killed one (``--with-ft ulfm``); a network link cut between
two nodes (network namespaces, root only); a truncated checkpoint and a corrupted one; SIGTERM
mid-epoch and the resumed run; a worker killed under ``--max_restarts``.

Each row (fault, backend, world size, measured time, outcome) is printed as soon as it is
measured. Only with ``--doc`` does the table replace the part of a document between its markers
(``docs/fault-tolerance.md`` when no path is given; the rest is left as written): the tracked
document changes only when asked to.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
# The helpers (fault_injection_job, dist_harness) are in tests/; the test modules some rows
# reuse are in the folders of what they test: test_heartbeat and test_mpi_heartbeat in
# distributed/health, test_multinode_netns in distributed/launch.
for _path in (ROOT, TESTS, TESTS / "distributed" / "health", TESTS / "distributed" / "launch"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

import fault_injection_job as faults  # noqa: E402
import fault_rows_mpi as mpi_rows  # noqa: E402

BEGIN, END = "<!-- fault-table:begin -->", "<!-- fault-table:end -->"
DETECT_LIMIT_S = 10.0
TRAINING_JOB = TESTS / "checkpoint_training_job.py"


class Row(dict):
    def __init__(self, fault, backend, world_size, seconds, ok, outcome):
        super().__init__(fault=fault, backend=backend, world_size=world_size,
                         seconds=None if seconds is None else round(seconds, 3), ok=ok,
                         outcome=outcome)


# ----- collective faults --------------------------------------------------------------------------
def _collective_row(fault: str, backend: str, victim: int, label: str) -> Row:
    with tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
        outcome = faults.run_fault(fault, backend, 3, victim, Path(tmp), detect_limit=20.0)
    reports = {r: outcome.errors.get(r) for r in outcome.survivors}
    named = sorted({e["peer"] for e in reports.values() if e})
    kinds = sorted({e["type"] for e in reports.values() if e})
    worst = outcome.worst_detection_s
    ok = (worst is not None and worst < DETECT_LIMIT_S and kinds == ["PeerFailureError"]
          and not outcome.leftover_pids and not outcome.leftover_segments)
    if worst is None:
        missing = [r for r, e in reports.items() if e is None]
        text = f"ranks {missing} raised nothing within 20 s"
    else:
        shared = sum("heartbeat:" in e["message"] for e in reports.values())
        via = ("the heartbeat" if shared == len(reports) else "the transport" if not shared
               else "the transport, then the heartbeat's shared report")
        text = (f"every survivor raised {'/'.join(kinds)} naming rank(s) {named} "
                f"(found by {via})")
    text += "; nothing left" if not (outcome.leftover_pids or outcome.leftover_segments) else \
        f"; LEFT: pids {outcome.leftover_pids}, segments {outcome.leftover_segments}"
    return Row(label, backend, 3, worst, ok, text)


def _netns_row() -> Row:
    import test_multinode_netns as netns
    label = "link cut between 2 nodes mid-run"
    reason = netns.namespaces_unavailable()
    if reason:
        return Row(label, "tcp", 4, None, False, f"not run: {reason}")
    with netns.NetnsPair() as pair, tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
        out, port, secret = Path(tmp), 20000 + secrets.randbelow(40000), secrets.token_hex(16)
        launchers = [pair.launch(n, port, secret, out, 90.0) for n in (0, 1)]
        looping = lambda: all((out / f"looping_{r}.json").exists() for r in range(4))
        if not faults._wait_for(looping, 60, launchers):
            netns.finish(launchers, 0)
            return Row(label, "tcp", 4, None, False, "the 2-node job did not start")
        cut = time.time()
        pair.cut()
        codes = netns.finish(launchers, 60)
        errors = [json.loads(p.read_text()) for p in sorted(out.glob("error_*.json"))]
    worst = max((e["time"] - cut for e in errors), default=None)
    ok = len(errors) == 4 and worst < DETECT_LIMIT_S and all(c not in (0, None) for c in codes)
    return Row(label, "tcp", 4, worst, ok,
               f"{len(errors)} of 4 ranks raised {sorted({e['type'] for e in errors})}; "
               f"launcher exit codes {codes}")


# ----- checkpoints and the launcher ---------------------------------------------------------------
def _checkpoint_row(label: str, damage) -> Row:
    from checkpoint_training_job import TrainingJob
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    with tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
        job, manager = TrainingJob(), DistributedCheckpointManager(tmp)
        paths = []
        for step in range(3):
            job.step(step)
            paths.append(manager.save_checkpoint(job.model, job.optimizer, 0, step, 1.0))
        bad_file = damage(Path(paths[-1]))
        records = []
        handler = logging.Handler()
        handler.emit = records.append
        logger = logging.getLogger("neural_arch.distributed.checkpoint")
        logger.addHandler(handler)
        try:
            start = time.perf_counter()
            target = TrainingJob(init_seed=7)
            info = manager.load_checkpoint(target.model, target.optimizer, restore_rng=False)
            seconds = time.perf_counter() - start
        finally:
            logger.removeHandler(handler)
    warned = any(bad_file in r.getMessage() for r in records)
    ok = info["step"] == 1 and warned
    return Row(label, "-", 1, seconds, ok, f"load fell back to step {info['step']} with a "
               f"warning naming {bad_file}" if ok else f"loaded step {info['step']}")


def _truncate(path: Path) -> str:
    target = path / "model.safetensors"
    with open(target, "r+b") as f:
        f.truncate(target.stat().st_size // 2)
    return "model.safetensors"


def _flip_byte(path: Path) -> str:
    target = path / "optimizer.safetensors"
    data = bytearray(target.read_bytes())
    data[-1] ^= 0x01
    target.write_bytes(bytes(data))
    return "optimizer.safetensors"


class _Launch:
    """The training job under the launcher (2 shm ranks); stderr lines are timestamped."""

    def __init__(self, out: Path, *args, max_restarts: int = 0) -> None:
        self.out, self.lines = out, []
        cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", str(TRAINING_JOB),
               "--nproc_per_node=2", "--backend=shm", f"--master_port={faults._free_port()}",
               f"--max_restarts={max_restarts}", "--", "--out", str(out), "--steps", "12",
               "--save_every", "3", *map(str, args)]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True, start_new_session=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.lines.append((time.time(), line))

    def finish(self, limit: float = 150.0) -> int:
        try:
            return self.proc.wait(limit)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            return self.proc.wait(10)
        finally:
            self._reader.join(5)

    def paused_pid(self, rank: int) -> int:
        path = self.out / f"paused_rank{rank}.json"
        faults._wait_for(path.exists, 90, [self.proc])
        return json.loads(path.read_text())["pid"]


def _final_weights(out: Path) -> dict:
    from neural_arch.nn.serialization import load_state_dict_file
    return dict(load_state_dict_file(out / "final.safetensors"))


def _same(a: dict, b: dict) -> bool:
    import numpy as np
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _starts(out: Path) -> list:
    return sorted(json.loads(p.read_text())["start_step"] for p in out.glob("start_rank*.json")
                  if json.loads(p.read_text())["resumed"])


def _launcher_rows(base: Path, rows: list) -> None:
    """Appends its rows to ``rows`` one by one, so that each is reported when measured."""
    (base / "plain").mkdir()
    plain = _Launch(base / "plain")
    if plain.finish() != 0:
        rows.append(Row("SIGTERM mid-epoch, then resume", "shm", 2, None, False,
                        "the uninterrupted reference run failed"))
        return
    reference = _final_weights(base / "plain")
    (base / "term").mkdir()
    run = _Launch(base / "term", "--pause_at", 4, "--pause_rank", 0)
    run.paused_pid(0)
    sent = time.time()
    run.proc.send_signal(signal.SIGTERM)
    code, stopped = run.finish(), time.time() - sent
    resumed = _Launch(base / "term")
    ok = code == 128 + signal.SIGTERM and resumed.finish() == 0 and \
        _starts(base / "term") == [5, 5] and _same(_final_weights(base / "term"), reference)
    rows.append(Row("SIGTERM mid-epoch, then resume", "shm", 2, stopped, ok,
                    "saved at step 4 and exited; the relaunch resumed at step 5 and ended with "
                    "weights identical to an uninterrupted run" if ok else f"exit code {code}"))
    (base / "restart").mkdir()
    run = _Launch(base / "restart", "--pause_at", 7, "--pause_rank", 1, max_restarts=1)
    victim = run.paused_pid(1)
    killed = time.time()
    os.kill(victim, signal.SIGKILL)
    code = run.finish()
    noticed = [t for t, line in run.lines if "restarting all 2 workers" in line]
    ok = code == 0 and _starts(base / "restart") == [6, 6] and \
        _same(_final_weights(base / "restart"), reference)
    rows.append(Row("worker SIGKILLed, --max_restarts=1", "shm", 2,
                    noticed[0] - killed if noticed else None, ok,
                    "the launcher restarted both workers, which resumed at step 6 and ended with "
                    "weights identical to an uninterrupted run" if ok else f"exit code {code}"))


# ----- the report ---------------------------------------------------------------------------------
def print_row(r: Row) -> None:
    print(f"{'ok ' if r['ok'] else 'FAILED'} {r['fault']} [{r['backend']}, "
          f"{r['world_size']}]: {r['seconds']} s: {r['outcome']}", flush=True)


class _Reported(list):
    """The rows measured so far; each is printed as it is added, not at the end of the run."""

    def __init__(self, report) -> None:
        super().__init__()
        self._report = report

    def append(self, row: Row) -> None:
        super().append(row)
        self._report(row)


def run_all(report=print_row) -> list:
    rows = _Reported(report)
    for backend in ("tcp", "shm"):
        for victim, where in ((0, "first"), (1, "middle"), (2, "last")):
            rows.append(_collective_row("kill", backend, victim,
                                        f"SIGKILL rank {victim} ({where}) mid-all-reduce"))
    rows.append(_collective_row("stop", "tcp", 1, "SIGSTOP rank 1 (hung)"))
    rows.append(_collective_row("stop", "tcp", 0, "SIGSTOP rank 0 (hung store host)"))
    rows.append(_collective_row("stop", "shm", 1, "SIGSTOP rank 1 (hung)"))
    rows.append(_collective_row("close_socket", "tcp", 1, "socket closed under all-reduce"))
    rows.append(mpi_rows.stop_on_one_host(Row, DETECT_LIMIT_S))
    mpi_rows.out_of_pid_sight(Row, DETECT_LIMIT_S, rows)
    rows.append(_netns_row())
    rows.append(_checkpoint_row("truncated checkpoint file", _truncate))
    rows.append(_checkpoint_row("corrupted checkpoint (checksum)", _flip_byte))
    with tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
        _launcher_rows(Path(tmp), rows)
    return list(rows)


def table(rows: list, command: str) -> str:
    lines = [BEGIN, f"Made by `{command}` on {time.strftime('%Y-%m-%d')} ({platform.machine()}, "
             f"{os.cpu_count()} CPUs, Python {platform.python_version()}). Passed "
             f"{sum(r['ok'] for r in rows)} of {len(rows)}.", "",
             "| fault | backend | world size | measured time (s) | outcome |",
             "|---|---|---|---|---|"]
    for r in rows:
        seconds = "-" if r["seconds"] is None else f"{r['seconds']:.3f}"
        mark = "ok" if r["ok"] else "**FAILED**"
        lines.append(f"| {r['fault']} | {r['backend']} | {r['world_size']} | {seconds} | "
                     f"{mark}: {r['outcome']} |")
    return "\n".join(lines + [END])


def write_table(doc: Path, text: str) -> None:
    current = doc.read_text() if doc.exists() else f"# Fault tolerance\n\n{BEGIN}\n{END}\n"
    if BEGIN not in current or END not in current:
        raise ValueError(f"{doc} has no {BEGIN} ... {END} markers to replace")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    doc.write_text(pattern.sub(lambda _: text, current, count=1))


DOC = ROOT / "docs" / "fault-tolerance.md"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[1],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--doc", type=Path, nargs="?", const=DOC, default=None,
                        help=f"write the table into this document's markers (no path: {DOC}); "
                             "without the option no file is written")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args(argv)
    rows = run_all()
    passed = sum(r["ok"] for r in rows)
    if args.doc is not None:
        command = "python scripts/fault_injection_report.py" + "".join(
            f" {a}" for a in (argv if argv is not None else sys.argv[1:]))
        write_table(args.doc, table(rows, command))
        print(f"passed {passed} of {len(rows)}; table written to {args.doc}", flush=True)
    else:
        print(f"passed {passed} of {len(rows)}; no document written (--doc writes the table "
              f"into {DOC.relative_to(ROOT)})", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
