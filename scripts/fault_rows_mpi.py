"""The MPI rows of the fault-injection report.

A stopped rank on one host (found by the pid watch), and, with a pid namespace per rank
standing in for other hosts, a stopped rank (found by the heartbeat store of
``neural_arch.distributed.health.mpi_heartbeat``) and a killed one under
``mpiexec --with-ft ulfm`` (found by MPI's own failure report). ``Row`` is the report's row type; times are from the
moment of the fault to the last survivor's error.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path


def stop_on_one_host(Row, limit_s: float):
    from dist_harness import RankFailed, mpi_available, run_ranks
    from test_heartbeat import _hang_under_mpi  # uses the default heartbeat settings
    if not mpi_available():
        return Row("SIGSTOP rank 1 (hung)", "mpi", 3, None, False, "not run: no mpi4py/mpiexec")
    with tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
        try:
            run_ranks(_hang_under_mpi, 3, "mpi", args=(tmp,), timeout=60)
        except RankFailed:
            pass  # the stopped rank never reports
        stopped = float(Path(tmp, "stopped_at").read_text())
        records = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in (0, 2)
                   if Path(tmp, f"rank{r}.json").exists()]
    worst = max((r["time"] - stopped for r in records), default=None)
    ok = len(records) == 2 and all(r["peer"] == 1 for r in records) and worst < limit_s
    return Row("SIGSTOP rank 1 (hung)", "mpi", 3, worst, ok,
               f"{len(records)} of 2 survivors raised PeerFailureError naming rank 1 (pid "
               "watch of same-host peers)")


def out_of_pid_sight(Row, limit_s: float, rows: list) -> None:
    """Appends its rows to ``rows`` one by one, so that each is reported when measured."""
    from dist_harness import mpi_available
    from test_mpi_heartbeat import namespaces_work, run_job
    faults = [("SIGSTOP", False, "SIGSTOP rank 1, ranks out of pid sight (hung)",
               "the heartbeat store"),
              ("SIGKILL", True, "SIGKILL rank 1, ranks out of pid sight, --with-ft ulfm",
               "MPI's failure report")]
    if not (mpi_available() and namespaces_work()):
        for _, _, label, _ in faults:
            rows.append(Row(label, "mpi", 3, None, False,
                            "not run: needs mpiexec, root and unshare"))
        return
    for signal_name, ulfm, label, finder in faults:
        with tempfile.TemporaryDirectory(prefix="nf_fault_") as tmp:
            records, _ = run_job(Path(tmp), 3, 1, signal_name, namespaces=True, ulfm=ulfm)
            fault_at = json.loads(Path(tmp, "out", "fault_at.json").read_text())
        survivors = [records[r] for r in (0, 2) if r in records and "peer" in records[r]]
        worst = max((r["raised_at"] - fault_at for r in survivors), default=None)
        ok = len(survivors) == 2 and all(r["peer"] == 1 for r in survivors) and worst < limit_s
        rows.append(Row(label, "mpi", 3, worst, ok,
                        f"{len(survivors)} of 2 survivors raised PeerFailureError naming rank 1 "
                        f"(found by {finder})"))
