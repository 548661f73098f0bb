"""Ranks arriving at the store: ``claim_rank`` (each rank joins once), ``wait_for_ranks`` (the
rendezvous: every rank has published its key) and ``barrier``. The two waits say on stderr
which ranks have not arrived yet, after 5 s and at intervals after (``waiting``), and name
them in the error that ends the wait.

``store`` imports ``barrier`` and ``claim_rank`` from here; all of them use only a connected
``TCPStore``'s requests.
"""
from __future__ import annotations

import os
import socket
from datetime import timedelta
from typing import Callable, Optional, Sequence, Union

from ..errors import CollectiveTimeoutError, RendezvousError
from .waiting import TIMEOUT_ENV, WaitReport, rendezvous_timeout

_CLAIM_KEY = "neural_arch/init/rank"
_LISTED_RANKS = 64  # above this, only rank 0 asks the store which ranks are missing
_SHOWN_RANKS = 16
_MIN_WAIT_S = 0.01


def _shown(ranks: list[int]) -> str:
    if len(ranks) <= _SHOWN_RANKS:
        return str(ranks)
    return f"{str(ranks[:_SHOWN_RANKS])[:-1]}, ... ({len(ranks)} ranks)]"


def _missing(store, key_of: Callable[[int], str], world_size: int) -> list[int]:
    return [r for r in range(world_size) if not store.check([key_of(r)])]


def _wait(store, keys: Sequence[str], report: WaitReport,
          not_arrived: Callable[[], str]) -> tuple[bool, str]:
    """Wait for ``keys`` until ``report.limit``, saying ``not_arrived()`` whenever a message is
    due: (whether the keys came, what was last said). The store going away (rank 0, which
    serves it, ended or gave up first) is a RendezvousError naming what was last said."""
    said = "no rank was named yet"
    try:
        while report.elapsed() < report.limit:
            chunk = min(report.limit - report.elapsed(), report.until_next())
            try:
                store.wait(list(keys), max(_MIN_WAIT_S, chunk))
                return True, said
            except CollectiveTimeoutError:
                if report.until_next() == 0 and report.elapsed() < report.limit:
                    said = not_arrived()
                    report.say(said)
    except RendezvousError as e:
        raise RendezvousError(f"waiting {report.what}: the store went away after "
                              f"{report.elapsed():.0f} s ({said}): {str(e).split('] ', 1)[-1]}",
                              rank=report.rank, op="store.wait") from None
    return False, said


def wait_for_ranks(store, rank: int, world_size: int, key_of: Callable[[int], str],
                   keys: Optional[Sequence[str]] = None) -> None:
    """The rendezvous: wait until every rank ``r`` has set ``key_of(r)`` (or, with ``keys``,
    until those are set: a key rank 0 sets once it has them all, so that the other ranks do
    not each wait on every key), for the rendezvous timeout within the store's (``waiting``).
    Meanwhile say which ranks have not set theirs; past the timeout raise RendezvousError
    naming them."""
    limit = rendezvous_timeout(store.timeout)
    where = f"{getattr(store, 'host', '?')}:{getattr(store, 'port', '?')}"
    title = f"at the rendezvous of {world_size} ranks (store {where})"
    report = WaitReport(rank, title, limit, TIMEOUT_ENV if limit < store.timeout else "")
    listed = world_size <= _LISTED_RANKS or rank == 0

    def not_arrived() -> str:
        if listed:
            missing = _missing(store, key_of, world_size)
            return f"ranks {_shown(missing)} of {world_size} have not arrived"
        return f"rank 0 has not heard from all {world_size} ranks (its messages name them)"

    waited_for = [key_of(r) for r in range(world_size)] if keys is None else keys
    came, said = _wait(store, waited_for, report, not_arrived)
    if not came:
        raise RendezvousError(f"the rendezvous of {world_size} ranks at {where} timed out "
                              f"after {limit:g} s{report.set_by()}; "
                              f"{_last_word(not_arrived, said)}", rank=rank,
                              op="init_process_group")


def _last_word(not_arrived: Callable[[], str], said: str) -> str:
    """Who has not arrived now; what was last said when the store is gone already (rank 0
    gave up at the same moment)."""
    try:
        return not_arrived()
    except RendezvousError:
        return f"{said} (the store is gone)"


def barrier(store, key_prefix: str, world_size: int, rank: int,
            timeout: Union[float, timedelta, None] = None) -> None:
    """Block until ``world_size`` ranks reach it; use a fresh ``key_prefix`` for each barrier.
    While it waits it says which ranks have not arrived; past ``timeout`` (the store's by
    default) it raises CollectiveTimeoutError naming them."""
    if not 0 <= rank < world_size:
        raise ValueError(f"barrier rank {rank} outside [0, {world_size})")
    limit = store.timeout if timeout is None else (
        timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout))
    arrived = lambda r: f"{key_prefix}/arrived/{r}"  # noqa: E731
    store.set(arrived(rank), b"1")
    if store.add(f"{key_prefix}/count", 1) == world_size:
        store.set(f"{key_prefix}/done", b"1")
    report = WaitReport(rank, f"at barrier {key_prefix!r} (store {store.host}:{store.port})",
                        limit)

    def not_arrived() -> str:
        if world_size <= _LISTED_RANKS or rank == 0:
            return (f"ranks {_shown(_missing(store, arrived, world_size))} of {world_size} "
                    "have not arrived")
        count = store.add(f"{key_prefix}/count", 0)
        return f"{count} of {world_size} ranks have arrived (rank 0 names the missing ones)"

    came, said = _wait(store, [f"{key_prefix}/done"], report, not_arrived)
    if not came:
        last = _last_word(lambda: f"ranks {_shown(_missing(store, arrived, world_size))} "
                                  "never arrived", said)
        raise CollectiveTimeoutError(f"barrier {key_prefix!r} timed out; {last}", rank=rank,
                                     op="store.barrier")


def claim_rank(store, rank: int) -> None:
    """Join ``store`` as ``rank``, or raise RendezvousError when another process already did.

    Rank 0 serves a fresh store for each job (and each restart), so each rank joins it once. A
    second claim means this rank reached another job's store: one started on the same
    MASTER_ADDR/MASTER_PORT with the same secret (its own rank 0 then failed to bind the port),
    or two processes of one job were given the same RANK. Without this check such a rank would
    read the other job's rendezvous data and wait for its own rank 0 until the timeout.
    """
    key = f"{_CLAIM_KEY}/{rank}"
    claims = store.add(key, 1)
    if claims == 1:
        store.set(f"{key}/by", f"pid {os.getpid()} on host {socket.gethostname()}")
        return
    # The first claimant writes who it is right after claiming; wait for that only briefly.
    try:
        holder = store.get(f"{key}/by", timeout=1.0).decode(errors="replace")
    except CollectiveTimeoutError:
        holder = "a process that has not said who it is yet"
    raise RendezvousError(
        f"the store at {store.host}:{store.port} already has a rank {rank}: {holder} joined it "
        f"as rank {rank} first (this process is join {claims} of rank {rank}). This store serves "
        "another job, started on the same MASTER_ADDR/MASTER_PORT with the same secret, or two "
        f"processes were given RANK={rank}; give each job its own MASTER_PORT", rank=rank,
        op="init_process_group")
