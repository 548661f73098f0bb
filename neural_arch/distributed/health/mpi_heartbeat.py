"""A heartbeat store for MPI jobs whose ranks cannot all see each other's pids.

The mpi backend needs no rendezvous store, so its heartbeat could only watch peers by pid, and
a rank that died or hung on another host went unnoticed until the collective timeout. When
the job spans hosts (or pid namespaces), rank 0 serves a small store on a free port just for
the heartbeat. Its addresses and a fresh secret reach the other ranks over MPI, a channel the
job already trusts (plain bytes, nothing unpickled); every rank connects, and the heartbeat then
runs as it does on tcp: a rank that dies anywhere is named within the heartbeat timeout.

The ranks agree on the outcome: when any rank cannot reach the store, every rank closes its
connection and warns, naming those ranks, and the job goes on with the pid watch alone (a
rank that never beats would otherwise be declared failed).

``NEURAL_ARCH_MPI_HEARTBEAT`` (the same on every rank): ``auto`` (default; a store when some
peer is out of pid sight), ``store`` (always) or ``pid`` (never).
"""
from __future__ import annotations

import json
import os
import secrets
import socket
import warnings
from typing import List, Mapping, Optional

import numpy as np

from ..errors import DistributedError
from ..rendezvous.store_server import is_loopback
from ..transports.base import Fingerprint
from . import heartbeat

MODE_ENV = "NEURAL_ARCH_MPI_HEARTBEAT"
MODES = ("auto", "store", "pid")
CONNECT_TIMEOUT_S = 5.0    # per address tried; the server listens before anyone tries
_LENGTH = np.dtype("<i8")
_MAX_INVITATION_BYTES = 1 << 16


def mode_from_env(environ: Optional[Mapping[str, str]] = None) -> str:
    environ = os.environ if environ is None else environ
    mode = environ.get(MODE_ENV, "auto").strip().lower() or "auto"
    if mode not in MODES:
        raise ValueError(f"{MODE_ENV}={environ[MODE_ENV]!r}: use one of {MODES}")
    return mode


def candidate_hosts() -> List[str]:
    """Addresses of this host that ranks elsewhere may reach, the likeliest first."""
    hosts = [os.environ.get("MASTER_ADDR", "").strip()]
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            # Connecting a UDP socket sends nothing; it picks the interface of the default route.
            probe.connect(("192.0.2.1", 9))
            hosts.append(probe.getsockname()[0])
    except OSError:
        pass
    name = socket.gethostname()
    try:
        hosts += socket.gethostbyname_ex(name)[2]
    except OSError:
        pass
    hosts.append(name)
    unique = [h for i, h in enumerate(hosts) if h and h not in hosts[:i]]
    reachable = [h for h in unique if not is_loopback(h)]
    return reachable or ["127.0.0.1"]


def _broadcast_bytes(transport, data: bytes, fp: Fingerprint) -> bytes:
    """Rank 0's ``data`` on every rank, over MPI, each wait bounded by the transport's timeout."""
    length = np.array([len(data)], _LENGTH)
    transport.run_collective(lambda comm: comm.Ibcast(length, root=0), fp)
    if not 0 < length[0] <= _MAX_INVITATION_BYTES:
        raise DistributedError(f"rank 0 sent a heartbeat invitation of {length[0]} bytes",
                               rank=transport.rank, peer=0, op=fp.op, seq=fp.seq)
    buf = np.frombuffer(bytearray(data), np.uint8) if transport.rank == 0 \
        else np.empty(int(length[0]), np.uint8)
    transport.run_collective(lambda comm: comm.Ibcast(buf, root=0), fp)
    return buf.tobytes()


def _connect(hosts: List[str], port: int, secret: bytes, world_size: int, rank: int):
    from ..rendezvous.store import TCPStore
    errors = []
    for host in hosts:
        try:
            return TCPStore(host, port, world_size, secret=secret, timeout=CONNECT_TIMEOUT_S,
                            rank=rank), ""
        except (OSError, DistributedError) as e:
            errors.append(f"{host}:{port}: {e}")
    return None, "; ".join(errors)


def _serve(world_size: int, timeout: float):
    """Rank 0: start the store; return it (None when it could not start), why not, and the
    invitation for the other ranks."""
    from ..rendezvous.store import TCPStore
    hosts, secret = candidate_hosts(), secrets.token_bytes(32)
    try:
        store = TCPStore(hosts[0], 0, world_size, is_server=True, secret=secret,
                         timeout=timeout, rank=0)
    except (OSError, DistributedError) as e:  # the others must hear of it, not wait
        why = f"rank 0 could not serve it: {e}"
        return None, why, {"error": why}
    return store, "", {"hosts": hosts, "port": store.port, "secret": secret.hex()}


def _accept(transport, fp: Fingerprint):
    """The other ranks: read rank 0's invitation and connect; return the store (None when
    unreachable) and why not."""
    try:
        invitation = json.loads(_broadcast_bytes(transport, b"", fp))
        why = str(invitation.get("error", ""))
        if why:
            return None, why
        hosts, port = [str(h) for h in invitation["hosts"]], int(invitation["port"])
        return _connect(hosts, port, bytes.fromhex(invitation["secret"]), transport.world_size,
                        transport.rank)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        return None, f"unreadable invitation from rank 0 ({e})"


def heartbeat_store(transport, timeout: float, mode: Optional[str] = None):
    """Collective over the mpi ``transport``: a connected ``TCPStore`` for the heartbeat (rank 0
    serves it), or None when every peer is in pid sight or some rank could not connect."""
    mode = mode_from_env() if mode is None else mode
    world_size, rank = transport.world_size, transport.rank
    out_of_sight = len(transport.local_peer_pids) < world_size - 1
    if world_size < 2 or mode == "pid" or (mode == "auto" and not out_of_sight):
        return None
    if not heartbeat.config_from_env().enabled:
        return None
    fp = Fingerprint("mpi.heartbeat_store", 0, "uint8", 0)
    store, why = None, ""
    try:
        if rank == 0:
            store, why, invitation = _serve(world_size, timeout)
            _broadcast_bytes(transport, json.dumps(invitation).encode(), fp)
        else:
            store, why = _accept(transport, fp)
        connected = np.array([store is not None], np.uint8)
        everyone = np.empty(world_size, np.uint8)
        transport.run_collective(lambda comm: comm.Iallgather(connected, everyone), fp)
    except BaseException:
        if store is not None:  # its server, or its connection, must not outlive the job
            store.close()
        raise
    missing = [r for r in range(world_size) if not everyone[r]]
    if not missing:
        return store
    if store is not None:
        store.close()
    warnings.warn(f"rank {rank}: rank(s) {missing} could not reach rank 0's heartbeat store"
                  + (f" ({why})" if why else "") + "; peers out of pid sight are watched only "
                  "by the collective timeout", RuntimeWarning, stacklevel=3)
    return None
