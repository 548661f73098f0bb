"""Shared-memory test support: a directory-backed store, a rank-process runner, and what a
rank's bad calls raise.

Each rank runs ``fn(rank, world_size, store, *args)`` in its own forked process and reports
its return value or the error it raised through a pipe. Every child is killed and reaped in
``finally``, so a failing test leaves no process behind.
"""
from __future__ import annotations

import fcntl
import multiprocessing as mp
import os
import signal
import time
import traceback
from multiprocessing.connection import wait as wait_connections
from pathlib import Path
from typing import Any, Callable, Optional

_ctx = mp.get_context("fork")


class DirStore:
    """The store interface (set / get / add) over files in one directory."""

    def __init__(self, path: str, timeout: float = 30.0) -> None:
        self.path = Path(path)
        self.timeout = timeout

    def _file(self, key: str) -> Path:
        return self.path / key.replace("/", "%2F")

    def set(self, key: str, value: bytes) -> None:
        tmp = self.path / f".tmp.{os.getpid()}.{time.monotonic_ns()}"
        tmp.write_bytes(bytes(value))
        os.replace(tmp, self._file(key))

    def get(self, key: str, timeout: Optional[float] = None) -> bytes:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        while True:
            try:
                return self._file(key).read_bytes()
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"store key {key!r} was not set within the timeout")
                time.sleep(0.002)

    def add(self, key: str, amount: int) -> int:
        with open(self.path / ".lock", "a+") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                value = int(self._file(key).read_bytes()) + amount
            except FileNotFoundError:
                value = amount
            self.set(key, str(value).encode())
            return value


def _child(fn: Callable, rank: int, world_size: int, store_dir: str, args: tuple, conn) -> None:
    try:
        value = fn(rank, world_size, DirStore(store_dir), *args)
        conn.send(("ok", value))
    except BaseException as e:  # noqa: BLE001 - reported to the parent, which decides
        conn.send(("error", type(e).__name__, str(e), getattr(e, "peer", None),
                   traceback.format_exc()))
    finally:
        conn.close()


class RankResult:
    def __init__(self, rank: int, pid: int, payload: Optional[tuple], exitcode: Optional[int]):
        self.rank, self.pid, self.exitcode = rank, pid, exitcode
        self.ok = payload is not None and payload[0] == "ok"
        self.value = payload[1] if self.ok else None
        self.error = payload[1] if payload is not None and not self.ok else None
        self.message = payload[2] if payload is not None and not self.ok else ""
        self.peer = payload[3] if payload is not None and not self.ok else None
        self.trace = payload[4] if payload is not None and not self.ok else ""

    def __repr__(self) -> str:
        if self.ok:
            return f"<rank {self.rank} ok>"
        return f"<rank {self.rank} {self.error}: {self.message} exit={self.exitcode}\n{self.trace}>"


def run_ranks(world_size: int, fn: Callable, *args: Any, store_dir: str, timeout: float = 60.0,
              on_start: Optional[Callable[[list], None]] = None) -> list[RankResult]:
    """Run ``fn`` on ``world_size`` forked ranks; return one RankResult per rank.

    ``on_start(processes)`` runs in the parent once all ranks started (e.g. to kill one).
    A rank that neither reports nor exits within ``timeout`` seconds is killed.
    """
    procs, conns = [], []
    try:
        for rank in range(world_size):
            parent_end, child_end = _ctx.Pipe(duplex=False)
            proc = _ctx.Process(target=_child,
                                args=(fn, rank, world_size, store_dir, args, child_end))
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        if on_start is not None:
            on_start(procs)
        payloads: list = [None] * world_size
        pending = {conn: rank for rank, conn in enumerate(conns)}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            for conn in wait_connections(list(pending), timeout=0.2):
                rank = pending.pop(conn)
                try:
                    payloads[rank] = conn.recv()
                except EOFError:
                    payloads[rank] = None  # died without reporting (killed)
        for proc in procs:
            proc.join(max(0.1, deadline - time.monotonic()))
        return [RankResult(r, procs[r].pid, payloads[r], procs[r].exitcode)
                for r in range(world_size)]
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
            proc.join(5)
        for conn in conns:
            conn.close()


def shm_names_of(pids) -> list[str]:
    """Segments in /dev/shm created by any of ``pids`` (names are nf_<creator pid>_...)."""
    prefixes = tuple(f"nf_{pid}_" for pid in pids)
    return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefixes))


def kill_self() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def errors_of(calls) -> list[str]:
    """What each of ``calls`` raised, as ``"ValueError: <message>"``, or ``"no error"``: for a
    rank that checks its bad-argument calls fail before any communication."""
    found = []
    for call in calls:
        try:
            call()
            found.append("no error")
        except (TypeError, ValueError) as e:
            found.append(f"{type(e).__name__}: {e}")
    return found
