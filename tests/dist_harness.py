"""Run a function on N real processes joined by ``init_process_group``; collect each result.

``run_ranks(fn, world_size, backend)`` starts one process per rank (forked from a forkserver
that has NumPy, ``neural_arch.distributed`` and Numba's CPU target preloaded, so starting is
cheap), gives each the launcher's environment (RANK, WORLD_SIZE, MASTER_ADDR, a free
MASTER_PORT, a fresh NEURAL_ARCH_SECRET), calls ``init_process_group(backend)`` and then
``fn(rank, world_size, *args)``. It returns the results in rank order, or raises
``RankFailed`` carrying the first failing rank and its traceback. For ``mpi`` the ranks run
under ``mpiexec`` instead, with this file as the runner and results passed back through files.
Every child is killed in ``finally`` and the whole run is bounded by ``timeout``. ``fn`` must
be a module-level function.
"""
from __future__ import annotations

import importlib.util
import json
import multiprocessing as mp
import os
import pickle
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import wait as wait_ready
from typing import Any, Callable, Optional, Sequence

from mpiexec_launch import run_until_launched

_ERROR_GRACE_S = 2.0  # after one rank fails, how long the others get to report theirs
_MPI_STOP_GRACE_S = 5.0
_START_ATTEMPTS = 3
_MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
            "OMPI_MCA_rmaps_base_oversubscribe": "1"}


class RankFailed(AssertionError):
    """A rank raised (or died); the message holds its rank and traceback."""

    def __init__(self, rank: int, summary: str, details: str) -> None:
        super().__init__(f"rank {rank} failed: {summary}\n{details}")
        self.rank, self.summary, self.details = rank, summary, details


def mpi_available() -> bool:
    return importlib.util.find_spec("mpi4py") is not None and shutil.which("mpiexec") is not None


def installed_backends() -> list[str]:
    from neural_arch.distributed.transports import available_transports
    names = [b for b in ("shm", "tcp") if b in available_transports()]
    if "mpi" in available_transports() and mpi_available():
        names.append("mpi")
    return names


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_env(rank: int, world_size: int, port: int, secret: str) -> dict[str, str]:
    return {"RANK": str(rank), "WORLD_SIZE": str(world_size), "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port), "NEURAL_ARCH_SECRET": secret}


def _run_one(fn: Callable, rank: int, world_size: int, backend: str, args: tuple,
             init_kwargs: dict) -> tuple:
    """Initialise, run ``fn``, tear down; ("ok", result) or ("error", summary, traceback)."""
    from neural_arch import distributed as dist
    try:
        if backend != "none":
            dist.init_process_group(backend=backend, **init_kwargs)
        try:
            return ("ok", fn(rank, world_size, *args))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent with its traceback
        return ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())


def _child(conn, fn, rank, world_size, backend, args, env, init_kwargs) -> None:
    os.environ.update(env)
    outcome = _run_one(fn, rank, world_size, backend, args, init_kwargs)
    try:
        conn.send(outcome)
    except Exception as exc:  # e.g. an unpicklable result
        conn.send(("error", f"result not picklable: {exc!r}", traceback.format_exc()))
    conn.close()


_CONTEXT = None


def _context():
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = mp.get_context("forkserver")
        # forkserver_preload: Numba's CPU target, which each rank would otherwise load anew
        _CONTEXT.set_forkserver_preload(["numpy", "neural_arch.distributed",
                                         "forkserver_preload"])
    return _CONTEXT


def each_case(run_case: Callable[[Any], Any], cases: Sequence[Any], what: str) -> dict:
    """On a rank of a job that runs several cases in turn: {case: ``run_case(case)``}. An error
    is noted with its case (``what`` names the case's fields), so that each test reading the
    job's results is told which case failed."""
    out = {}
    for case in cases:
        try:
            out[case] = run_case(case)
        except BaseException as exc:
            getattr(exc, "add_note", print)(f"in {what} = {case!r}")  # Python < 3.11: printed
            raise
    return out


def job_once(jobs: dict, key: Any, start: Callable[[], list]) -> list:
    """Every rank's result of the job ``start()``, started once per ``key`` (``jobs``: a
    module's own cache): the first test asking starts it, later tests read it. A job that
    failed fails every test that asks, each with its error."""
    if key not in jobs:
        try:
            jobs[key] = start()
        except Exception as exc:
            jobs[key] = exc
    if isinstance(jobs[key], Exception):
        raise jobs[key]
    return jobs[key]


def run_ranks(fn: Callable, world_size: int, backend: str, timeout: float = 60.0,
              args: Sequence[Any] = (), env: Optional[dict] = None,
              init_kwargs: Optional[dict] = None, may_die: Sequence[int] = ()) -> list[Any]:
    """Results of ``fn(rank, world_size, *args)`` on every rank, in rank order.

    ``backend="none"`` skips ``init_process_group``. Ranks in ``may_die`` may exit without a
    result (their entry is None) instead of failing the run.
    """
    init_kwargs = dict(init_kwargs or {})
    if backend == "mpi":  # RankFailed holds mpiexec's output when no rank reported
        return run_until_launched(lambda: _run_mpi(fn, world_size, timeout, tuple(args),
                                                   env or {}, init_kwargs, set(may_die)))
    attempt = 1
    while True:
        try:
            return _run_forked(fn, world_size, backend, timeout, tuple(args), env or {},
                               init_kwargs, set(may_die))
        except RankFailed as exc:
            # another process took the "free" port before rank 0 could listen on it
            if "port in use" not in exc.summary or attempt == _START_ATTEMPTS:
                raise
            attempt += 1


def _run_forked(fn, world_size: int, backend: str, timeout: float, args: tuple, env: dict,
                init_kwargs: dict, may_die: set) -> list[Any]:
    ctx = _context()
    port, secret = free_port(), secrets.token_hex(16)
    procs, conns = [], []
    try:
        for rank in range(world_size):
            rank_env = {**_rank_env(rank, world_size, port, secret), **env}
            reader, writer = ctx.Pipe(duplex=False)
            proc = ctx.Process(target=_child, daemon=True, name=f"rank-{rank}",
                               args=(writer, fn, rank, world_size, backend, args, rank_env,
                                     init_kwargs))
            proc.start()
            writer.close()
            procs.append(proc)
            conns.append(reader)
        return _collect(procs, conns, timeout, may_die)
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.kill()
        for proc in procs:
            proc.join(5.0)
        for conn in conns:
            conn.close()


def _collect(procs, conns, timeout: float, may_die: set) -> list[Any]:
    deadline = time.monotonic() + timeout
    outcomes: dict[int, tuple] = {}
    pending = {conn: rank for rank, conn in enumerate(conns)}
    sentinels = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    while pending and time.monotonic() < deadline:
        waiting = set(pending.values())
        watched = list(pending) + [s for s, r in sentinels.items() if r in waiting]
        ready = wait_ready(watched, timeout=max(0.0, deadline - time.monotonic()))
        for obj in ready:
            if obj in pending:
                rank = pending.pop(obj)
                try:
                    outcomes[rank] = obj.recv()
                except EOFError:
                    outcomes[rank] = _died(rank, procs[rank], may_die)
            elif sentinels.get(obj) in pending.values():
                rank = sentinels[obj]
                conn = conns[rank]
                if not conn.poll(0):  # exited without a word
                    pending.pop(conn)
                    outcomes[rank] = _died(rank, procs[rank], may_die)
        failed = [r for r, o in outcomes.items() if o[0] == "error"]
        if failed and pending:
            deadline = min(deadline, time.monotonic() + _ERROR_GRACE_S)
    return _results(outcomes, len(procs), pending.values(), timeout)


def _died(rank: int, proc, may_die: set) -> tuple:
    proc.join(1.0)
    if rank in may_die:
        return ("ok", None)
    return ("error", f"process exited with code {proc.exitcode} before reporting", "")


def _results(outcomes: dict, world_size: int, unfinished, timeout: float) -> list[Any]:
    errors = sorted(r for r, o in outcomes.items() if o[0] == "error")
    if errors:
        rank = errors[0]
        _, summary, details = outcomes[rank]
        others = [f"rank {r}: {outcomes[r][1]}" for r in errors[1:]]
        if others:
            details += "\nother failing ranks:\n  " + "\n  ".join(others)
        raise RankFailed(rank, summary, details)
    unfinished = sorted(unfinished)
    if unfinished:
        raise RankFailed(unfinished[0], f"ranks {unfinished} did not finish within {timeout} s",
                         "")
    return [outcomes[r][1] for r in range(world_size)]


# ----- mpiexec ---------------------------------------------------------------------------------
def _run_mpi(fn, world_size: int, timeout: float, args: tuple, env: dict,
             init_kwargs: dict, may_die: set) -> list[Any]:
    with tempfile.TemporaryDirectory(prefix="nf_mpi_") as tmp:
        with open(os.path.join(tmp, "sys_path.json"), "w") as f:
            json.dump(sys.path, f)
        with open(os.path.join(tmp, "job.pkl"), "wb") as f:
            pickle.dump({"fn": fn, "args": args, "init_kwargs": init_kwargs}, f)
        child_env = {**os.environ, **_MPI_ENV, **_rank_env(0, world_size, free_port(),
                                                           secrets.token_hex(16)), **env}
        for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            child_env.pop(name, None)  # let mpiexec's own variables say who is who
        # A rank allowed to die must not take the job down: Open MPI 5 keeps survivors alive
        # with --enable-recovery.
        recovery = ["--enable-recovery"] if may_die else []
        cmd = ["mpiexec", "-n", str(world_size), "--oversubscribe", *recovery, sys.executable,
               os.path.abspath(__file__), tmp]
        proc = subprocess.Popen(cmd, env=child_env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            output = b""
        finally:
            output = (output or b"") + _stop_mpiexec(proc, tmp, world_size)
        outcomes = {}
        for rank in range(world_size):
            path = os.path.join(tmp, f"rank{rank}.pkl")
            if os.path.exists(path):
                with open(path, "rb") as f:
                    outcomes[rank] = pickle.load(f)
        tail = output.decode(errors="replace")[-3000:]
        for rank in may_die:
            outcomes.setdefault(rank, ("ok", None))
        missing = [r for r in range(world_size) if r not in outcomes]
        if missing and not any(o[0] == "error" for o in outcomes.values()):
            raise RankFailed(missing[0], f"ranks {missing} reported nothing (mpiexec exit code "
                             f"{proc.returncode})", tail)
        return _results(outcomes, world_size, [], timeout)


def _stop_mpiexec(proc: subprocess.Popen, job_dir: str, world_size: int) -> bytes:
    """Stop a still-running job: SIGTERM lets mpiexec stop its ranks and remove its shared
    memory; whatever is left after a grace period is killed."""
    if proc.poll() is not None:
        return b""
    proc.terminate()
    try:
        return proc.communicate(timeout=_MPI_STOP_GRACE_S)[0] or b""
    except subprocess.TimeoutExpired:
        pass
    os.killpg(proc.pid, signal.SIGKILL)
    for rank in range(world_size):  # ranks run in sessions of their own
        try:
            with open(os.path.join(job_dir, f"rank{rank}.pid")) as f:
                os.kill(int(f.read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass
    return proc.communicate()[0] or b""


def _mpi_main(job_dir: str) -> None:
    # The search path comes first, in its own file, so that unpickling ``fn`` can import it.
    with open(os.path.join(job_dir, "sys_path.json")) as f:
        sys.path[:0] = [p for p in json.load(f) if p not in sys.path]
    with open(os.path.join(job_dir, "job.pkl"), "rb") as f:
        job = pickle.load(f)
    rank = int(os.environ["OMPI_COMM_WORLD_RANK"])
    size = int(os.environ["OMPI_COMM_WORLD_SIZE"])
    with open(os.path.join(job_dir, f"rank{rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    outcome = _run_one(job["fn"], rank, size, "mpi", job["args"], job["init_kwargs"])
    path = os.path.join(job_dir, f"rank{rank}.pkl")
    with open(path + ".tmp", "wb") as f:
        pickle.dump(outcome, f)
    os.replace(path + ".tmp", path)
    if outcome[0] == "error":
        from mpi4py import MPI  # stop the other ranks now rather than at their timeout
        MPI.COMM_WORLD.Abort(1)


if __name__ == "__main__":
    _mpi_main(sys.argv[1])
