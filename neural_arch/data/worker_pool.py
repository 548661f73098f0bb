"""The main-process side of ``DataLoader(num_workers > 0)``: worker processes, in-order batches.

As in torch, the sampler runs here: batch ``k``'s indices go to worker ``k mod num_workers``
(``prefetch_factor`` batches per worker in flight), and batches are handed out in sampler order
whatever order they arrive in, so the batches are the ones ``num_workers=0`` makes. Each task
carries the epoch's generation number, so that a persistent worker's late answer to an epoch
that was left early is recognised and dropped.
"""
from __future__ import annotations

import multiprocessing
import os
import pickle
import queue
import signal
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .worker import WorkerError, worker_loop

# How often the main process, while waiting for a batch, checks that its workers still run.
STATUS_CHECK_INTERVAL = 0.1
# How long shutdown waits for a worker to end on its own before killing it (a worker stuck in a
# dataset call never reads the request to end; its batches are no longer wanted anyway).
SHUTDOWN_WAIT = 1.0


def worker_exit_description(exitcode: Optional[int]) -> str:
    """``is killed by signal: Killed (SIGKILL)`` or ``exited unexpectedly with exit code 3``."""
    if exitcode is not None and exitcode < 0:
        number = -exitcode
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"is killed by signal: {signal.strsignal(number) or name} ({name})"
    return f"exited unexpectedly with exit code {exitcode}"


class WorkerPool:
    """``num_workers`` processes that turn batch index lists into batches, in order."""

    def __init__(self, dataset: Any, collate_fn: Optional[Callable], num_workers: int,
                 prefetch_factor: int, timeout: float, worker_init_fn: Optional[Callable],
                 base_seed: int, context: Any, wrap_batch: Callable[[Any], Any],
                 persistent: bool = False) -> None:
        self.num_workers, self.timeout = num_workers, float(timeout)
        self.persistent = persistent  # else the workers end with the epoch
        self.in_flight_limit = prefetch_factor * num_workers
        self.wrap_batch = wrap_batch  # turns a fetched array tuple into Tensors (or no-op)
        self.result_queue = context.Queue()
        self.index_queues: List[Any] = []
        self.workers: List[Any] = []
        self.generation = 0
        self.closed = False
        for worker_id in range(num_workers):
            index_queue = context.Queue()
            index_queue.cancel_join_thread()  # never block this process's exit on unsent tasks
            process = context.Process(
                target=worker_loop, name=f"DataLoaderWorker-{worker_id}", daemon=True,
                args=(dataset, index_queue, self.result_queue, collate_fn, worker_init_fn,
                      base_seed, worker_id, num_workers, os.getpid()))
            process.start()
            self.index_queues.append(index_queue)
            self.workers.append(process)
        self._batches: Sequence[Any] = ()

    @property
    def pids(self) -> List[int]:
        return [p.pid for p in self.workers]

    def start_epoch(self, batches: Sequence[Any]) -> None:
        """Begin handing out ``batches`` (index lists); answers to earlier epochs are dropped."""
        if self.closed:
            raise RuntimeError("DataLoader workers were shut down; this iterator cannot restart")
        self.generation += 1
        self._batches = batches
        self._next_to_send = 0
        self._next_to_yield = 0
        self._arrived: Dict[int, Any] = {}
        while self._next_to_send < min(len(batches), self.in_flight_limit):
            self._send_next()

    def _send_next(self) -> None:
        number = self._next_to_send
        worker_id = number % self.num_workers
        indices = [int(i) for i in self._batches[number]]
        self.index_queues[worker_id].put((self.generation, number, indices))
        self._next_to_send += 1

    def __iter__(self) -> "WorkerPool":
        return self

    def __len__(self) -> int:
        return len(self._batches)

    def __next__(self) -> Any:
        if self.closed or self._next_to_yield >= len(self._batches):
            if not self.persistent:
                self.shutdown()
            raise StopIteration
        number = self._next_to_yield
        result = self._arrived.pop(number, None)
        started = time.monotonic()  # the timeout bounds the wait for this one batch
        while result is None:
            self._receive_one(number, started)
            result = self._arrived.pop(number, None)
        self._next_to_yield += 1
        if self._next_to_send < len(self._batches):
            self._send_next()
        batch = pickle.loads(result)
        if isinstance(batch, WorkerError):
            batch.reraise()
        return self.wrap_batch(batch)

    def _receive_one(self, waiting_for: int, started: float) -> None:
        """Wait for one answer of this epoch, checking the workers and the timeout meanwhile."""
        while True:
            poll = STATUS_CHECK_INTERVAL
            if self.timeout > 0:
                left = self.timeout - (time.monotonic() - started)
                if left <= 0:
                    worker_id = waiting_for % self.num_workers
                    self.shutdown()
                    raise RuntimeError(
                        f"DataLoader timed out after {self.timeout} seconds waiting for batch "
                        f"{waiting_for} from worker {worker_id} (pid {self.pids[worker_id]})")
                poll = min(poll, left)
            try:
                worker_id, generation, number, result = self.result_queue.get(timeout=poll)
            except queue.Empty:
                self._check_workers_alive()
                continue
            if generation == self.generation:
                self._arrived[number] = result
                return

    def _check_workers_alive(self) -> None:
        for worker_id, process in enumerate(self.workers):
            if not process.is_alive():
                exitcode = process.exitcode
                self.shutdown()
                raise RuntimeError(f"DataLoader worker {worker_id} (pid {process.pid}) "
                                   f"{worker_exit_description(exitcode)}")

    def shutdown(self) -> None:
        """End every worker (asking first, then terminating) and close the queues."""
        if self.closed:
            return
        self.closed = True
        for index_queue, process in zip(self.index_queues, self.workers):
            if process.is_alive():
                try:
                    index_queue.put(None)
                except (OSError, ValueError):
                    pass
        deadline = time.monotonic() + SHUTDOWN_WAIT
        for process in self.workers:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
            if process.is_alive():  # stuck in a dataset call: it gets no more say
                process.kill()
                process.join(timeout=SHUTDOWN_WAIT)
        for q in self.index_queues + [self.result_queue]:
            q.cancel_join_thread()
            q.close()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:  # interpreter shutdown: modules may already be gone
            pass


def get_context(multiprocessing_context: Any) -> Any:
    """A multiprocessing context from None (fork where available, as torch on Linux), a start
    method's name, or a context object."""
    if multiprocessing_context is None:
        methods = multiprocessing.get_all_start_methods()
        return multiprocessing.get_context("fork" if "fork" in methods else None)
    if isinstance(multiprocessing_context, str):
        methods = multiprocessing.get_all_start_methods()
        if multiprocessing_context not in methods:
            raise ValueError(f"multiprocessing_context={multiprocessing_context!r} is not a start "
                             f"method of this platform; choose one of {methods}")
        return multiprocessing.get_context(multiprocessing_context)
    if not hasattr(multiprocessing_context, "Process"):
        raise TypeError(f"multiprocessing_context must be a start method's name or a "
                        f"multiprocessing context, got {type(multiprocessing_context).__name__}")
    return multiprocessing_context
