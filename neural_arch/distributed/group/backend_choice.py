"""How ``init_process_group`` picks a backend when asked for "auto" (or "gloo").

Under mpiexec with mpi4py installed: MPI. Otherwise every rank publishes an identity of its
host through the store (hostname, boot id, IPC namespace: equal exactly when two processes
can map the same shared-memory segment); rank 0 chooses "shm" if all are equal and "tcp"
if not, and publishes the choice so that every rank takes the same one.

Before that, every rank that meets the others at a store publishes the backend it asked for
(``agree_on_backend``): ranks that asked for different ones would each wait at a different
transport's rendezvous until the timeout; instead all of them fail at once, naming who chose
what.
"""
from __future__ import annotations

import json
from typing import Any

from .. import transports
from ..errors import CollectiveMismatchError, CollectiveTimeoutError, RendezvousError
from ..processes import host_identity
from ..rendezvous.arrival import wait_for_ranks
from ..rendezvous.env import is_launched_by_mpi
from ..transports.base import who_chose

BACKENDS = ("auto", "gloo", "shm", "tcp", "mpi")
_HOST_KEY = "neural_arch/init/host"
_BACKEND_KEY = "neural_arch/init/backend"
# How long rank 0, which serves the store, keeps it up after a disagreement so that every other
# rank can read the verdict; they are all waiting for it already.
_VERDICT_GRACE_S = 10.0


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
    store.set(f"{_HOST_KEY}/{info.rank}", host_identity("ipc").encode())
    if info.rank == 0:
        hosts = {store.get(f"{_HOST_KEY}/{r}") for r in range(info.world_size)}
        local = len(hosts) == 1 and transports.is_available("shm")
        store.set(f"{_HOST_KEY}/choice", b"shm" if local else b"tcp")
    return store.get(f"{_HOST_KEY}/choice").decode()


def backend_key(rank: int) -> str:
    """The store key under which ``rank`` publishes the backend it asked for."""
    return f"{_BACKEND_KEY}/{rank}"


def agree_on_backend(info, store, requested: str) -> None:
    """Every rank publishes the backend it asked for; rank 0 publishes the whole list. Unless
    all are the same, every rank raises CollectiveMismatchError naming the ranks that chose each
    backend."""
    store.set(backend_key(info.rank), requested.encode())
    # The rendezvous: bounded by its own timeout, saying meanwhile which ranks are missing.
    wait_for_ranks(store, info.rank, info.world_size, backend_key,
                   None if info.rank == 0 else [f"{_BACKEND_KEY}/all"])
    if info.rank == 0:
        chosen = [store.get(backend_key(r)).decode() for r in range(info.world_size)]
        store.set(f"{_BACKEND_KEY}/all", json.dumps(chosen).encode())
    chosen = json.loads(store.get(f"{_BACKEND_KEY}/all"))
    if len(set(chosen)) == 1:
        return
    try:
        if store.add(f"{_BACKEND_KEY}/read", 1) == info.world_size:
            store.set(f"{_BACKEND_KEY}/all_read", b"1")
        if info.rank == 0:  # closing the store before the others read the list would fail them
            store.wait([f"{_BACKEND_KEY}/all_read"], timeout=_VERDICT_GRACE_S)
    except (CollectiveTimeoutError, RendezvousError):
        # A rank died meanwhile, or rank 0 closed the store the moment the last rank was
        # counted, before its answer left: the disagreement is still the error to report.
        pass
    raise CollectiveMismatchError(
        f"ranks asked for different backends: {who_chose(chosen, 'chose {!r}')}; every rank must "
        "pass the same backend to init_process_group", rank=info.rank, op="init_process_group")
