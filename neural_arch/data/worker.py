"""What runs inside a ``DataLoader`` worker process, and ``get_worker_info`` for datasets.

A worker takes ``(generation, batch number, indices)`` tasks from its own index queue, builds
the batch (the dataset's ``_fetch_batch`` arrays, or the samples through the collate function)
and puts ``(worker id, generation, batch number, pickled result)`` on the shared result queue.
The result is pickled here, not by the queue's feeder thread, so that a batch that cannot be
pickled becomes an error the main process reports instead of a batch that never arrives.

A worker ends on ``None``, and also on its own when its parent is gone (its parent pid
changes), so that a main process killed without cleaning up leaves no workers behind.
"""
from __future__ import annotations

import os
import pickle
import queue
import random
import traceback
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

# How often an idle worker checks that its parent still runs (seconds).
PARENT_CHECK_INTERVAL = 0.25


@dataclass(frozen=True)
class WorkerInfo:
    """Who this worker is: ``id`` in ``[0, num_workers)``, its ``seed`` and its ``dataset`` copy."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: Optional[WorkerInfo] = None


def get_worker_info() -> Optional[WorkerInfo]:
    """In a ``DataLoader`` worker process, its ``WorkerInfo``; in any other process, ``None``."""
    return _worker_info


class WorkerError:
    """An exception raised in a worker, carried to the main process with its traceback text."""

    def __init__(self, worker_id: int, where: str, error: BaseException) -> None:
        self.worker_id, self.where = worker_id, where
        self.type_name = type(error).__name__
        self.traceback = "".join(traceback.format_exception(type(error), error,
                                                            error.__traceback__))
        try:  # the original type, when the main process can rebuild it by import
            self.error_type = pickle.loads(pickle.dumps(type(error)))
        except Exception:  # a class defined in a function cannot be pickled
            self.error_type = None

    def reraise(self) -> None:
        """Raise the worker's exception in this process: same type where possible (as torch)."""
        message = (f"Caught {self.type_name} in DataLoader worker process {self.worker_id} "
                   f"{self.where}.\nOriginal {self.traceback}")
        error_type = self.error_type
        if error_type is None or not issubclass(error_type, Exception):
            raise RuntimeError(message)
        try:
            error = error_type(message)
        except Exception:  # a constructor that needs other arguments
            raise RuntimeError(message) from None
        try:
            raise error
        finally:  # no cycle through this frame that would keep the workers' iterator alive
            del error


def seed_worker(seed: int, worker_id: int) -> None:
    """Seed every generator a dataset may use: ``random``, NumPy's legacy global generator and
    the framework's global generator (``manual_seed``)."""
    from ..core.random import manual_seed
    random.seed(seed)
    np.random.seed(np.random.SeedSequence([worker_id, seed]).generate_state(4))
    manual_seed(seed)


def _build_batch(dataset: Any, indices: Any, collate_fn: Optional[Callable]) -> Any:
    if collate_fn is None:  # the dataset fetches whole batches: plain arrays travel back
        from .dataset import batch_fetcher
        return tuple(batch_fetcher(dataset)(np.asarray(indices, dtype=np.int64)))
    return collate_fn([dataset[int(i)] for i in indices])


def _parent_gone(parent_pid: int) -> bool:
    return os.getppid() != parent_pid


def worker_loop(dataset: Any, index_queue: Any, result_queue: Any, collate_fn: Optional[Callable],
                worker_init_fn: Optional[Callable[[int], None]], base_seed: int, worker_id: int,
                num_workers: int, parent_pid: int) -> None:
    """The body of worker process ``worker_id`` (``collate_fn`` None: use ``_fetch_batch``)."""
    global _worker_info
    seed = base_seed + worker_id
    init_error: Optional[WorkerError] = None
    try:
        seed_worker(seed, worker_id)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                  dataset=dataset)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
    except Exception as error:  # reported with the first batch asked of this worker
        init_error = WorkerError(worker_id, "in worker_init_fn", error)
    try:
        while True:
            try:
                task = index_queue.get(timeout=PARENT_CHECK_INTERVAL)
            except queue.Empty:
                if _parent_gone(parent_pid):
                    return
                continue
            if task is None:
                return
            generation, batch_number, indices = task
            if init_error is not None:
                result = pickle.dumps(init_error)
            else:
                try:
                    batch = _build_batch(dataset, indices, collate_fn)
                    result = pickle.dumps(batch, protocol=pickle.HIGHEST_PROTOCOL)
                except Exception as error:
                    result = pickle.dumps(WorkerError(
                        worker_id, f"while making batch {batch_number}", error))
            result_queue.put((worker_id, generation, batch_number, result))
    except KeyboardInterrupt:  # the main process handles Ctrl-C; the worker just ends
        pass
    finally:
        # Do not wait at exit for results nobody will read (the main process may be gone).
        result_queue.cancel_join_thread()
