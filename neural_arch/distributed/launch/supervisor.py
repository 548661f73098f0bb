"""The launcher proper: start, watch and tear down a group of workers.

Each worker runs in its own session (so a stray grandchild is stopped with it), with its output
prefixed by rank and mirrored to ``rank_<R>.log``. When one worker fails, the others get SIGTERM,
then SIGKILL after a grace period, and the whole group restarts while ``max_restarts`` allows.
Should the launcher itself be killed, the guard process does that stopping (``guard``).
"""
from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from typing import (Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple, Union)

from .args import LaunchConfig, Target, parse_launcher_args
from .guard import LauncherGuard
from .startup import LaunchError, prepare_rendezvous, worker_command
from .workers import WorkerOutput, WorkerProcess, describe_exit, exit_code

__all__ = ["DistributedLauncher", "LaunchError", "LaunchOutcome", "launch_distributed_training",
           "main"]

TIMEOUT_EXIT_CODE = 124  # as coreutils' timeout
_FORWARDED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class LaunchOutcome(NamedTuple):
    """How ``run()`` ended: ``kind`` is "success", "failure", "signal" or "timeout"; ``rank`` the
    worker that failed first (-1 when none did); ``code`` its Popen return code (negative: the
    signal that ended it), or the signal the launcher received."""
    kind: str
    rank: int
    code: int


class DistributedLauncher:
    """Runs this node's ``nproc_per_node`` workers of a job; ``run()`` returns the exit code.

    ``script_or_fn`` is a script path (a module name with ``run_module=True``, a program with
    ``no_python=True``) or a picklable callable, called as ``fn(*script_args)`` in a fresh
    interpreter prepared as multiprocessing's "spawn" start method does.
    """

    def __init__(self, script_or_fn: Target, nproc_per_node: Union[int, str] = 1,
                 nnodes: int = 1, node_rank: int = 0, master_addr: str = "127.0.0.1",
                 master_port: int = 29500, backend: str = "auto", script_args: Sequence[Any] = (),
                 max_restarts: int = 0, log_dir: Optional[Union[str, os.PathLike]] = None,
                 env: Optional[Mapping[str, str]] = None, *, run_module: bool = False,
                 no_python: bool = False, standalone: bool = False,
                 monitor_interval: float = 0.1, timeout: Optional[float] = None,
                 prefix_output: bool = True, grace_period: float = 5.0,
                 announce_end: bool = True) -> None:
        self.config = LaunchConfig(
            script_or_fn, nproc_per_node, nnodes, node_rank, master_addr, master_port, backend,
            tuple(script_args), max_restarts, log_dir, env, run_module, no_python, standalone,
            monitor_interval, timeout, prefix_output, grace_period)
        self._signals: List[int] = []
        self._guard: Optional[LauncherGuard] = None
        # False: no closing note on how the run ended (a caller that reports it itself)
        self._announce_end = announce_end
        # how the last run() ended, for callers that want more than the exit code
        self.outcome = LaunchOutcome("success", -1, 0)

    @property
    def ranks(self) -> List[int]:
        """Global ranks of this node's workers."""
        first = self.config.node_rank * self.config.nproc_per_node
        return list(range(first, first + self.config.nproc_per_node))

    def run(self) -> int:
        """Start the workers, watch them, restart the group on failure; returns the exit code."""
        cfg = self.config
        self._signals.clear()
        argv, payload = worker_command(cfg)
        prepare_rendezvous(cfg)
        job_env, notes = cfg.job_environment()
        output = WorkerOutput(cfg.prefix_output, cfg.log_dir, self.ranks)
        for note in notes:
            output.note(note)
        deadline = None if cfg.timeout is None else time.monotonic() + float(cfg.timeout)
        restart = 0
        try:
            self._guard = LauncherGuard(cfg.grace_period)
            with self._signal_handlers():
                while True:
                    kind, rank, code = self._run_attempt(argv, payload, job_env, restart, output,
                                                         deadline)
                    if self._signals and kind != "success":
                        kind, code = "signal", self._signals[0]  # never restart after a signal
                    if kind != "failure" or restart == cfg.max_restarts:
                        return self._conclude(kind, rank, code, output)
                    restart += 1
                    output.note(f"rank {rank} failed with {describe_exit(code)}; restarting all "
                                f"{cfg.nproc_per_node} workers (restart {restart} of "
                                f"{cfg.max_restarts}, RESTART_COUNT={restart})", to_logs=True)
        finally:
            if self._guard is not None:
                self._guard.close()
                self._guard = None
            output.close()

    def stop(self, signum: int = signal.SIGTERM) -> None:
        """End the run from another thread as a signal would: the workers get ``signum``, a
        grace period, then SIGKILL; ``run()`` returns 128 + ``signum``, no restart."""
        self._signals.append(signum)  # read by run()'s loop, as the handlers' signals are

    def _conclude(self, kind: str, rank: int, code: int, output: WorkerOutput) -> int:
        self.outcome = LaunchOutcome(kind, rank, code)
        if kind == "success":
            return 0
        if not self._announce_end:
            return 128 + code if kind == "signal" else (
                TIMEOUT_EXIT_CODE if kind == "timeout" else exit_code(code))
        if kind == "signal":
            output.note(f"received {signal.Signals(code).name}; stopped all workers")
            return 128 + code
        if kind == "timeout":
            output.note(f"the run exceeded --timeout={self.config.timeout}s; stopped all workers")
            return TIMEOUT_EXIT_CODE
        log = output.log_paths.get(rank)
        output.note(f"rank {rank} failed with {describe_exit(code)}; "
                    + (f"log: {log}" if log else "no log file (see --log_dir)"))
        return exit_code(code)

    def _run_attempt(self, argv: List[str], payload: Optional[bytes], job_env: Dict[str, str],
                     restart: int, output: WorkerOutput, deadline: Optional[float]
                     ) -> Tuple[str, int, int]:
        """Returns (kind, rank, code): success, failure (rank, Popen code), signal, timeout."""
        cfg = self.config
        workers: List[WorkerProcess] = []
        try:
            for local_rank in range(cfg.nproc_per_node):
                env = cfg.worker_environment(job_env, local_rank, restart)
                rank = int(env["RANK"])
                try:
                    workers.append(WorkerProcess(rank, argv, env, payload, output))
                except OSError as exc:
                    raise LaunchError(f"cannot start worker rank {rank} ({argv[0]!r}): {exc}",
                                      rank=rank, op="launch") from exc
                self._guard.watch(workers[-1].proc.pid)  # the worker leads its process group
            while True:
                if self._signals:
                    self._stop(workers, self._signals[0])
                    return "signal", -1, self._signals[0]
                codes = [worker.proc.poll() for worker in workers]
                failed = [(w.rank, c) for w, c in zip(workers, codes) if c not in (None, 0)]
                if failed:
                    self._stop(workers, signal.SIGTERM)
                    return ("failure",) + min(failed)
                if all(code == 0 for code in codes):
                    self._stop(workers, signal.SIGTERM)  # strays left in the groups, if any
                    return "success", -1, 0
                if deadline is not None and time.monotonic() >= deadline:
                    self._stop(workers, signal.SIGTERM)
                    return "timeout", -1, 0
                time.sleep(cfg.monitor_interval)
        except BaseException:
            self._stop(workers, signal.SIGTERM)
            raise

    def _stop(self, workers: List[WorkerProcess], signum: int) -> None:
        """Signal every group, wait up to the grace period, then SIGKILL what is left."""
        signals_seen = len(self._signals)
        for worker in workers:
            worker.signal_group(signum)
        give_up = time.monotonic() + self.config.grace_period
        while any(w.alive() for w in workers) and time.monotonic() < give_up:
            if len(self._signals) > signals_seen:
                break  # a second signal: the user wants out now
            time.sleep(0.02)
        for worker in workers:
            worker.signal_group(signal.SIGKILL)
        give_up = time.monotonic() + 2.0
        for worker in workers:
            worker.finish(give_up)
            if not worker.alive():
                self._guard.forget(worker.proc.pid)

    @contextmanager
    def _signal_handlers(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield  # only the main thread may install handlers
            return

        def record(signum: int, _frame: Any) -> None:
            self._signals.append(signum)

        previous = {sig: signal.signal(sig, record) for sig in _FORWARDED_SIGNALS}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def launch_distributed_training(script_or_fn: Union[str, os.PathLike, Callable[..., Any]],
                                nproc_per_node: Union[int, str] = 1, nnodes: int = 1,
                                node_rank: int = 0, master_addr: str = "127.0.0.1",
                                master_port: int = 29500, backend: str = "auto",
                                script_args: Sequence[Any] = (), max_restarts: int = 0,
                                log_dir: Optional[Union[str, os.PathLike]] = None,
                                env: Optional[Mapping[str, str]] = None, **options: Any) -> int:
    """Run a script or a picklable callable in ``nproc_per_node`` workers; returns the exit code.

    Further keyword options are those of :class:`DistributedLauncher` (``standalone``,
    ``timeout``, ``prefix_output``, ...).
    """
    return DistributedLauncher(script_or_fn, nproc_per_node, nnodes, node_rank, master_addr,
                               master_port, backend, script_args, max_restarts, log_dir, env,
                               **options).run()


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Command-line entry point; returns the process exit status."""
    args = parse_launcher_args(sys.argv[1:] if argv is None else argv)
    try:
        launcher = DistributedLauncher(
            args.script, args.nproc_per_node, args.nnodes, args.node_rank, args.master_addr,
            args.master_port, args.backend, args.script_args, args.max_restarts, args.log_dir,
            run_module=args.module, no_python=args.no_python, standalone=args.standalone,
            monitor_interval=args.monitor_interval, timeout=args.timeout,
            prefix_output=not args.no_prefix)
    except (ValueError, TypeError) as exc:
        args.parser.error(str(exc))
    try:
        return launcher.run()
    except LaunchError as exc:
        print(f"launcher: error: {exc}", file=sys.stderr, flush=True)
        return 1

