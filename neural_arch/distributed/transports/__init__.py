"""Transports by backend name: which exist here, and how to start one.

A backend name maps to a factory ``factory(rank, world_size, store, timeout, secret) ->
Transport``. ``trusted`` marks transports whose peers are proven members of the job (the TCP
transport authenticates every connection with the job secret; shared memory and MPI never leave
the job's own processes); only those may carry pickled objects. Availability is checked without
importing transport modules, so asking never initialises MPI.
"""
from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from typing import Callable, Optional

from .base import Fingerprint, Transport

Factory = Callable[..., Transport]


@dataclass(frozen=True)
class TransportSpec:
    name: str
    factory: Factory
    trusted: bool
    needs_store: bool = True
    requires: tuple[str, ...] = ()  # importable modules the transport needs
    probe: Optional[Callable[[], bool]] = None  # a run-time check beyond imports (a GPU)


def _module(name: str):
    return importlib.import_module(f"{__name__}.{name}")


def _shm(rank, world_size, store, timeout, secret):
    return _module("shm").create(rank, world_size, store, timeout)


def _tcp(rank, world_size, store, timeout, secret):
    return _module("tcp").create(rank, world_size, store, timeout, secret=secret)


def _mpi(rank, world_size, store, timeout, secret):
    return _module("mpi").create(rank=rank, world_size=world_size, store=store, timeout=timeout)


def _nccl(rank, world_size, store, timeout, secret):
    return _module("nccl").create(rank, world_size, store, timeout)


_REGISTRY: dict[str, TransportSpec] = {
    "shm": TransportSpec("shm", _shm, trusted=True, requires=(f"{__name__}.shm",)),
    "tcp": TransportSpec("tcp", _tcp, trusted=True, requires=(f"{__name__}.tcp",)),
    "mpi": TransportSpec("mpi", _mpi, trusted=True, needs_store=False,
                         requires=(f"{__name__}.mpi", "mpi4py")),
    # The unique id travels through the authenticated store, so only job members can join.
    "nccl": TransportSpec("nccl", _nccl, trusted=True, requires=(f"{__name__}.nccl", "cupy"),
                          probe=lambda: _module("nccl").is_available()),
}


def register_transport(name: str, factory: Factory, *, trusted: bool = False,
                       needs_store: bool = True) -> None:
    """Add (or replace) a backend; ``trusted`` only if every peer is authenticated or local."""
    if not isinstance(name, str) or not name or name in ("auto", "gloo"):
        raise ValueError(f"transport name must be a non-empty string other than 'auto' and "
                         f"'gloo', got {name!r}")
    _REGISTRY[name] = TransportSpec(name, factory, trusted, needs_store)


def known_transports() -> list[str]:
    """Every registered backend name, available here or not."""
    return list(_REGISTRY)


def spec(name: str) -> TransportSpec:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown transport {name!r}; known: {sorted(_REGISTRY)}") from None


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_available(name: str) -> bool:
    entry = spec(name)
    if name == "shm" and os.name != "posix":  # POSIX shared memory only
        return False
    return all(_importable(m) for m in entry.requires) and (entry.probe is None
                                                            or entry.probe())


def available_transports() -> list[str]:
    """Backend names that can run in this installation, in preference order."""
    return [name for name in _REGISTRY if is_available(name)]


def create_transport(name: str, *, rank: int, world_size: int, store, timeout: float,
                     secret: Optional[bytes] = None) -> Transport:
    entry = spec(name)
    if not is_available(name):
        missing = [m for m in entry.requires if not _importable(m)]
        why = f"missing: {missing}" if missing else "its run-time check found no usable device"
        raise ValueError(f"transport {name!r} is not available here ({why})")
    if entry.needs_store and store is None:
        raise ValueError(f"transport {name!r} needs a store to rendezvous")
    return entry.factory(rank, world_size, store, timeout, secret)


def at_process_exit(peer_failed: bool = False) -> None:
    """At interpreter exit, after the process group is destroyed: let each transport module this
    process loaded end what it must (an MPI job broken by a failure is ended rather than
    finalized, see ``mpi.at_process_exit``). Loads nothing, so it never initialises MPI."""
    for name in list(_REGISTRY):
        module = sys.modules.get(f"{__name__}.{name}")
        hook = getattr(module, "at_process_exit", None)
        if hook is not None:
            hook(peer_failed)


__all__ = ["at_process_exit", "Fingerprint", "Transport", "TransportSpec", "available_transports",
           "create_transport", "is_available", "known_transports", "register_transport", "spec"]
