"""How ``init_process_group`` picks a backend when asked for "auto" (or "gloo").

Under mpiexec with mpi4py installed: MPI. Otherwise every rank publishes an identity of its
host through the store (hostname, boot id, IPC namespace: equal exactly when two processes
can map the same shared-memory segment); rank 0 chooses "shm" if all are equal and "tcp"
if not, and publishes the choice so that every rank takes the same one.
"""
from __future__ import annotations

import os
import socket
from typing import Any

from .. import transports
from ..rendezvous.env import is_launched_by_mpi

BACKENDS = ("auto", "gloo", "shm", "tcp", "mpi")
_HOST_KEY = "neural_arch/init/host"


def _host_identity() -> str:
    """Hostname, boot id and IPC namespace: equal when two processes can share shm segments."""
    parts = [socket.gethostname()]
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            parts.append(f.read().strip())
        parts.append(str(os.stat("/proc/self/ns/ipc").st_ino))
    except OSError:
        pass  # not Linux: the hostname alone has to do
    return "|".join(parts)


def normalize_backend(backend: Any) -> str:
    """A backend name as ``init_process_group`` uses it ("gloo" means CPU auto)."""
    name = str(getattr(backend, "value", backend)).lower()
    known = set(BACKENDS) | set(transports.known_transports())
    if name not in known:
        raise ValueError(f"unknown backend {backend!r}; choose one of {sorted(known)}")
    return "auto" if name == "gloo" else name


def launched_by_mpi() -> bool:
    """Started by mpiexec/mpirun with mpi4py installed: "auto" then means the MPI backend."""
    return is_launched_by_mpi() and transports.is_available("mpi")


def choose_on_one_host(info, store) -> str:
    """Rank 0 compares every rank's host identity and publishes "shm" or "tcp"."""
    store.set(f"{_HOST_KEY}/{info.rank}", _host_identity().encode())
    if info.rank == 0:
        hosts = {store.get(f"{_HOST_KEY}/{r}") for r in range(info.world_size)}
        local = len(hosts) == 1 and transports.is_available("shm")
        store.set(f"{_HOST_KEY}/choice", b"shm" if local else b"tcp")
    return store.get(f"{_HOST_KEY}/choice").decode()
