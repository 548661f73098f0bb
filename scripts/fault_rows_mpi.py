"""The MPI row runners of the fault-injection report (see ``fault_rows`` for the contract).

A stopped rank on one host (found by the pid watch), and, with a pid namespace per rank
standing in for other hosts, a stopped rank (found by the heartbeat store of
``neural_arch.distributed.health.mpi_heartbeat``) and a killed one under
``mpiexec --with-ft ulfm`` (found by MPI's own failure report). Times are from the moment of
the fault to the last survivor's error.
"""
from __future__ import annotations

import json
from pathlib import Path

from fault_rows import Run, not_run


def stop_on_one_host(tmp: Path) -> Run:
    from dist_harness import RankFailed, mpi_available, run_ranks
    from test_heartbeat import _hang_under_mpi  # uses the default heartbeat settings
    if not mpi_available():
        return not_run("no mpi4py/mpiexec")
    try:
        run_ranks(_hang_under_mpi, 3, "mpi", args=(str(tmp),), timeout=60)
    except RankFailed:
        pass  # the stopped rank never reports
    stopped = float(Path(tmp, "stopped_at").read_text())
    records = [json.loads(Path(tmp, f"rank{r}.json").read_text()) for r in (0, 2)
               if Path(tmp, f"rank{r}.json").exists()]
    worst = max((r["time"] - stopped for r in records), default=None)
    ok = len(records) == 2 and all(r["peer"] == 1 for r in records)
    return Run(worst, ok, f"{len(records)} of 2 survivors raised PeerFailureError naming rank 1 "
               "(pid watch of same-host peers)")


def out_of_pid_sight(signal_name: str, ulfm: bool, finder: str, tmp: Path) -> Run:
    """``signal_name`` to rank 1 of 3 ranks, each in a pid namespace of its own."""
    from dist_harness import mpi_available
    from test_mpi_heartbeat import namespaces_work, run_job
    if not (mpi_available() and namespaces_work()):
        return not_run("needs mpiexec, root and unshare")
    records, _ = run_job(tmp, 3, 1, signal_name, namespaces=True, ulfm=ulfm)
    fault_at = json.loads(Path(tmp, "out", "fault_at.json").read_text())
    survivors = [records[r] for r in (0, 2) if r in records and "peer" in records[r]]
    worst = max((r["raised_at"] - fault_at for r in survivors), default=None)
    ok = len(survivors) == 2 and all(r["peer"] == 1 for r in survivors)
    return Run(worst, ok, f"{len(survivors)} of 2 survivors raised PeerFailureError naming "
               f"rank 1 (found by {finder})")
