"""Noticing that a peer died or that the job must stop, so no rank waits forever.

``heartbeat`` is the failure detector collectives consult, ``monitors`` its watcher threads
(counters in the store, ``store_monitor``, or pids on one host; both a ``monitor_thread``),
``mpi_heartbeat`` the store MPI jobs use for it, and ``preemption`` the clean stop on SIGTERM
or Ctrl-C, agreed across ranks.

Nothing is imported here: process groups load ``heartbeat`` alone, the rest on demand.
"""
