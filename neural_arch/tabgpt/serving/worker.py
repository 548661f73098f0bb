"""``BatchingWorker``: one thread that runs a model on the ``DynamicBatcher``'s batches and hands
each caller its own rows of the result.

``submit(rows)`` returns a ``concurrent.futures.Future``; ``predict(rows, timeout)`` waits for
it. The thread sleeps in ``DynamicBatcher.next_batch`` until a batch is ready (full, or its
oldest request has waited ``timeout_ms``: one wait with that deadline, woken early only by a
full batch), calls ``model_fn(batch)`` with the ``PaddedBatch`` outside the batcher's lock and
splits what it returns (one entry per row) by request. An exception in ``model_fn``, or a batch
that cannot be made (lengths ``do_not_pad`` cannot join), goes to every caller of that batch,
and the thread goes on with the next one. Every wait has a timeout: the callers'
(``predict``), the thread's (the deadline, or ``_IDLE_WAIT_S`` with nothing queued),
``close``'s join.
"""
from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any, Callable

from .batcher import DynamicBatcher, PaddedBatch

__all__ = ["BatchingWorker"]

_IDLE_WAIT_S = 1.0  # with nothing queued; a request or close wakes the thread at once
_JOIN_TIMEOUT_S = 10.0


class BatchingWorker:
    def __init__(self, model_fn: Callable[[PaddedBatch], Any], batcher: DynamicBatcher) -> None:
        if not callable(model_fn):
            raise TypeError(f"BatchingWorker model_fn must be callable, got "
                            f"{type(model_fn).__name__}")
        self.model_fn, self.batcher = model_fn, batcher
        self.batches_run = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="dynamic-batcher", daemon=True)
        self._thread.start()

    def submit(self, rows: Any) -> Future:
        future: Future = Future()
        with self.batcher.changed:  # close sets the flag under it: no request slips past
            if self._stop.is_set():
                raise RuntimeError("BatchingWorker is closed: no new requests")
            self.batcher.add_request(rows, ticket=future)
        return future

    def predict(self, rows: Any, timeout: float = 30.0) -> Any:
        """This request's rows of the model's output (waits at most ``timeout`` seconds)."""
        return self.submit(rows).result(timeout=timeout)

    def _loop(self) -> None:
        while True:
            try:
                # closing (the flag set): what was accepted still gets its answer, at once
                batch = self.batcher.next_batch(_IDLE_WAIT_S, flush=self._stop.is_set)
            except ValueError as exc:
                for future in getattr(exc, "tickets", ()):
                    future.set_exception(exc)
                continue
            if batch is not None:
                self._run(batch)
            elif self._stop.is_set():
                return

    def _run(self, batch: PaddedBatch) -> None:
        try:
            parts = batch.split(self.model_fn(batch))
        except BaseException as exc:  # noqa: BLE001 - every caller of the batch must hear it
            for future in batch.requests:
                future.set_exception(exc)
            return
        finally:
            self.batches_run += 1
        for future, part in zip(batch.requests, parts):
            future.set_result(part)

    def close(self) -> None:
        """Answer what is queued, then stop the thread."""
        with self.batcher.changed:
            self._stop.set()
            self.batcher.changed.notify_all()
        self._thread.join(timeout=_JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            raise RuntimeError(f"BatchingWorker: the batching thread did not stop within "
                               f"{_JOIN_TIMEOUT_S} s (a model call still running?)")

    def __enter__(self) -> "BatchingWorker":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
