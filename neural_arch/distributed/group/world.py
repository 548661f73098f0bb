"""The process group: rendezvous, the job's transport, and the groups built on top of it.

``init_process_group`` finds the job's ranks through the environment (``env.resolve``), meets
the other ranks at a ``TCPStore`` served by rank 0, picks a backend and connects a transport.
Subgroups from ``new_group`` reuse that transport through rank translation; their messages carry
their own group id and sequence numbers, so a mix-up between groups is detected, not misread.
"""
from __future__ import annotations

import atexit
import os
import socket
import zlib
from typing import Any, Optional, Sequence

from .. import algorithms, transports
from ..health import heartbeat
from ..transports.base import Transport
from ..work import CommQueue, Seconds, to_seconds
from .backend_choice import (agree_on_backend, choose_on_one_host, launched_by_mpi,
                             normalize_backend)
from .agreement import check_environment_agrees, check_same_everywhere
from .process_group import ProcessGroup
from .short_calls import ShortCalls
from .subgroup_transport import GroupTransport

DEFAULT_TIMEOUT_S = 1800.0


class _World:
    def __init__(self, info, backend: str, store, transport: Optional[Transport],
                 timeout: float) -> None:
        self.info, self.backend, self.store, self.transport = info, backend, store, transport
        self.queue = CommQueue(info.rank, timeout)
        trusted = transport is None or transports.spec(backend).trusted
        self.default = ProcessGroup(0, range(info.world_size), info.rank, transport, self.queue,
                                    backend, timeout, trusted)
        self.groups = [self.default]
        # The public calls' short entries (see ``short_calls``): those of the transport's own
        # collectives when those serve the default group and run small calls from plans
        # (shared memory's), else the general ones.
        native = transport.native_collectives() if transport is not None else None
        self.transport_short = (getattr(native, "short_calls", None)
                                if native is not None and native.preferred else None)
        self.general_short = (ShortCalls(self.default) if transport is not None
                              and self.transport_short is None else None)


_WORLD: Optional[_World] = None


def init_process_group(backend: str = "auto", init_method: str = "env://",
                       world_size: Optional[int] = None, rank: Optional[int] = None,
                       timeout: Seconds = DEFAULT_TIMEOUT_S, store=None) -> None:
    """Join the job: rendezvous, choose the backend, connect the transport."""
    global _WORLD
    if _WORLD is not None:
        raise RuntimeError("the default process group is already initialized; call "
                           "destroy_process_group() first")
    from ..rendezvous.env import backend_from_environment, resolve
    seconds = to_seconds(timeout)
    algorithms.read_environment()
    requested = normalize_backend(backend)
    if requested == "auto":
        # The launcher's --backend reaches workers as NEURAL_ARCH_BACKEND (or its alias
        # NEURAL_FORGE_BACKEND); "auto" defers to it.
        requested = normalize_backend(backend_from_environment() or "auto")
    if requested == "auto" and launched_by_mpi():
        requested = "mpi"
    owns_store = store is None and (requested == "auto" or transports.spec(requested).needs_store)
    # Only a store this process serves or joins needs MASTER_ADDR/MASTER_PORT.
    info = resolve(init_method, world_size, rank, master_needed=owns_store)
    if info.world_size == 1:
        chosen = requested if requested != "auto" else "shm"
        _WORLD = _World(info, chosen, None, None, seconds)
        return
    secret = None
    transport = None
    try:
        if owns_store:
            from ..rendezvous.secret import job_secret
            from ..rendezvous.job import job_identity
            from ..rendezvous.store import TCPStore, claim_rank
            secret = job_secret()
            # A rank that reaches another job's store (same port) fails at once naming both.
            job, _ = job_identity(info, os.environ, secret)
            store = TCPStore(info.master_addr, info.master_port, info.world_size,
                             is_server=info.rank == 0, secret=secret, timeout=seconds,
                             rank=info.rank, job=job)
            claim_rank(store, info.rank)  # before anything is read from, or written to, it
        if store is not None:
            agree_on_backend(info, store, requested)
        chosen = choose_on_one_host(info, store) if requested == "auto" else requested
        if chosen == "tcp" and secret is None:
            from ..rendezvous.secret import job_secret
            secret = job_secret()
        transport = transports.create_transport(chosen, rank=info.rank,
                                                world_size=info.world_size, store=store,
                                                timeout=seconds, secret=secret)
        if store is None and chosen == "mpi":  # a store for the heartbeat, when ranks span hosts
            from ..health.mpi_heartbeat import heartbeat_store
            store = heartbeat_store(transport, seconds)
            owns_store = store is not None
        world = _World(info, chosen, store, transport, seconds)
        # Nobody may close the store (rank 0 serves it) while a peer still needs it: the check
        # returns only once every rank took part, as a barrier would.
        check_environment_agrees(transport)
        heartbeat.start(info.rank, info.world_size, store, transport)
    except BaseException:
        if transport is not None:
            transport.close()
        if owns_store and store is not None:
            store.close()
        raise
    _WORLD = world


def destroy_process_group(group: Optional[ProcessGroup] = None) -> None:
    """Tear down ``group``, or (default) every group, the transport and the store."""
    _destroy(group, abandoned=False)


def _destroy(group: Optional[ProcessGroup], abandoned: bool) -> None:
    global _WORLD
    world = _WORLD
    if world is None:
        if group is None:
            return
        raise RuntimeError("the default process group is not initialized")
    if group is not None and group is not world.default:
        group.destroyed = True
        return
    _WORLD = None
    for g in world.groups:
        g.destroyed = True
    if world.general_short is not None:  # none may run on the transport closed below
        world.general_short.clear()
    try:
        world.queue.close()
    finally:
        # Marks this rank as leaving, so peers do not take it for hung; at exit, declares it
        # failed first.
        heartbeat.stop(abandoned=abandoned)
        try:
            if world.transport is not None:
                world.transport.close()
        finally:
            if world.store is not None:
                world.store.close()


def _at_exit() -> None:
    """The interpreter exits: tear down what is left, then let the transports end the job if
    it is broken (an MPI job then ends rather than waiting for its peers in MPI_Finalize).

    A group still in use here was abandoned: the program ended (or raised) without
    ``destroy_process_group`` while peers may wait for this rank in a collective, so this is no
    clean departure (see ``heartbeat.stop``)."""
    peer_failed = bool(heartbeat.failures())  # tearing down forgets them
    try:
        _destroy(None, abandoned=True)
    finally:
        transports.at_process_exit(peer_failed)


atexit.register(_at_exit)


def is_initialized() -> bool:
    return _WORLD is not None


def world() -> _World:
    if _WORLD is None:
        raise RuntimeError("the default process group is not initialized; call "
                           "init_process_group() first")
    return _WORLD


def has_short_calls() -> bool:
    """Whether calls on the default group may have short entries (``short_calls``): asked when
    a call found none, so that a group without them costs one question, not a lookup."""
    w = _WORLD
    return w is not None and (w.transport_short is not None or w.general_short is not None)


def short_calls() -> Optional[Any]:
    """The short calls serving the default group, bound to it, or None (not initialised, one
    rank, a closed transport): those of the transport's own collectives where it has plans
    (shared memory's ``short_calls``), else ``group.short_calls``' general entries."""
    w = _WORLD
    if w is None:
        return None
    short = w.general_short if w.general_short is not None else w.transport_short
    return short if short is not None and short.bind(w.default) else None


def resolve_group(group: Optional[ProcessGroup]) -> ProcessGroup:
    w = _WORLD if _WORLD is not None else world()  # world() raises the "not initialized" error
    if group is None:
        return w.default
    if not isinstance(group, ProcessGroup):
        raise TypeError(f"group must be a ProcessGroup from new_group() or None, got {group!r}")
    return group


def get_rank(group: Optional[ProcessGroup] = None) -> int:
    """This process's rank in ``group`` (-1 when it is not a member, as in PyTorch)."""
    return resolve_group(group).rank


def get_world_size(group: Optional[ProcessGroup] = None) -> int:
    g = resolve_group(group)
    return g.size if g.is_member else -1


def get_local_rank() -> int:
    return world().info.local_rank


def get_backend(group: Optional[ProcessGroup] = None) -> str:
    return resolve_group(group).backend


def get_distributed_info() -> dict:
    """A summary of the process group, safe to call before ``init_process_group``."""
    w = _WORLD
    info = {
        "available": True,
        "initialized": w is not None,
        "backend": w.backend if w else None,
        "rank": w.info.rank if w else 0,
        "world_size": w.info.world_size if w else 1,
        "local_rank": w.info.local_rank if w else 0,
        "local_world_size": w.info.local_world_size if w else 1,
        "host": socket.gethostname(),
        "available_transports": transports.available_transports(),
    }
    if w is not None:
        info["master_addr"], info["master_port"] = w.info.master_addr, w.info.master_port
        info["launcher"] = w.info.launcher
        info["heartbeat"] = heartbeat.status()
    return info


def new_group(ranks: Optional[Sequence[int]] = None, backend: Optional[str] = None,
              **_pytorch_options: Any) -> ProcessGroup:
    """A group of ``ranks`` (sorted, as in PyTorch). Every rank of the job must call it.

    Subgroups share the job's transport, its timeout and its issue order, so PyTorch's other
    options (``timeout``, ``pg_options``, ...) are accepted and have no effect.
    """
    w = world()
    n = w.info.world_size
    members = sorted(range(n) if ranks is None else (int(r) for r in ranks))
    if len(set(members)) != len(members) or not members or not all(0 <= r < n for r in members):
        raise ValueError(f"new_group ranks must be distinct, non-empty and in [0, {n}), "
                         f"got {None if ranks is None else list(ranks)}")
    if backend is not None and normalize_backend(backend) not in ("auto", w.backend):
        raise ValueError(f"new_group backend {backend!r} differs from the job's {w.backend!r}; "
                         "subgroups share the job's transport")
    group_id = len(w.groups)
    # Every rank must agree on the membership, or later collectives would talk past each other.
    check_same_everywhere(w.default, "new_group", [group_id, zlib.crc32(repr(members).encode())],
                          f"new_group #{group_id} ranks {members}")
    me = w.info.rank
    transport = None
    if me in members and len(members) > 1:
        transport = (w.transport if len(members) == n
                     else GroupTransport(w.transport, members, members.index(me)))
    group = ProcessGroup(group_id, members, me, transport, w.queue, w.backend, w.default.timeout,
                         w.default.trusted)
    w.groups.append(group)
    return group
