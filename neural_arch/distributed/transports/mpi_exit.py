"""How a process of a broken MPI job ends: at once, without ``MPI_Finalize``.

mpi4py finalizes MPI when the interpreter exits, and ``MPI_Finalize`` waits for every rank of
the job. A rank that raised because a peer is stopped, dead or gone would wait there for that
peer for ever, and mpiexec with it. The transport marks the job broken when a wait of this
process gives up on a failed peer (``mark_broken``); at exit, after the process group is
destroyed (``transports.at_process_exit``), such a process lingers a moment so that its peers
can report the failure too, then exits with code 1 without finalizing. mpiexec takes a rank
that ends so for a failed job and ends every rank, the failed one included, and exits non-zero.
``os._exit`` rather than ``MPI_Abort``: the survivors of a failure exit at about the same time,
and Open MPI's launcher can crash when several ranks abort at once.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Optional

# At exit after a failure, how long this rank lets its peers' wait loops (which look every
# 0.5 s) and pid watches find the failure and report it before it ends the job.
_EXIT_LINGER_S = 2.0
_broken: Optional[str] = None  # why this process's MPI job is broken (see ``at_process_exit``)


def mark_broken(why: str) -> None:
    """A wait gave up on a failed peer: this process must not finalize MPI (the first reason
    stays)."""
    global _broken
    if _broken is None:
        _broken = why


def at_process_exit(peer_failed: bool = False) -> None:
    """At interpreter exit, once the process group is destroyed and before mpi4py's
    ``MPI_Finalize``: end the whole job when this process's MPI job is broken.

    ``MPI_Finalize`` waits for every rank of the job, and a stopped or hung peer never
    comes, so a survivor that raised would hang there (and mpiexec with it). Exiting without it
    makes mpiexec end every rank, the failed one included, and exit non-zero: the job failed.
    Output is flushed first (the traceback of the error is printed before exit hooks run).
    ``peer_failed``: the heartbeat knew of a failed peer, whether or not a wait here saw it."""
    why = _broken or ("the heartbeat declared a peer failed" if peer_failed else None)
    MPI = sys.modules.get("mpi4py.MPI")
    if why is None or MPI is None or not MPI.Is_initialized() or MPI.Is_finalized():
        return
    if MPI.COMM_WORLD.Get_size() < 2:
        return
    time.sleep(_EXIT_LINGER_S)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(1)
