"""The Starlette application: ``POST /predict`` and ``GET /health`` over a ``TabularPredictor``.

``GET /health?pieces_since=P&batches_since=B`` summarises the times of the pieces and batches
recorded after the first P and B (the ``recorded`` counts of an earlier answer), so a load test
reads its own window; without them, everything kept.

A request handler never blocks the event loop: it submits the request's rows to the batching
thread and awaits their futures, so concurrent requests are in the batcher together and share
batches. Every answer is JSON; an error is ``{"error": message}`` with 400 (the request's
fault: bad JSON, an unknown or absent column, a value of the wrong type), 413 (too large),
503 (shutting down), 504 (no answer within ``request_timeout_s``) or 500 (the model failed),
never a traceback.
"""
from __future__ import annotations

import asyncio
import logging
import threading
import weakref
from concurrent.futures import Future
from typing import Any, List, Tuple

import numpy as np
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from .predictor import TabularPredictor
from .rows import RequestError, parse_rows

__all__ = ["build_app"]

MAX_BODY_BYTES = 16 * 1024 * 1024
MAX_ROWS = 65536
_log = logging.getLogger("neural_arch.serve")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _read_body(request: Request) -> bytes:
    """The body, refused past ``MAX_BODY_BYTES`` without reading the rest into memory."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise RequestError(f"the body has {declared} bytes; at most {MAX_BODY_BYTES}", status=413)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY_BYTES:
            raise RequestError(f"the body is over {MAX_BODY_BYTES} bytes", status=413)
        chunks.append(chunk)
    return b"".join(chunks)


class _Deliveries:
    """Results the batching thread hands to one event loop. A batch's requests complete one
    after another on that thread, and waking the loop for each (a write to its self-pipe, then
    the interpreter lock handed to the loop and back) would hold the batching thread on the
    loop's work once per request: the first result of a run wakes the loop, and the loop then
    settles every result that has arrived by then."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._arrived: List[Tuple["asyncio.Future[Any]", Future]] = []

    def post(self, waiter: "asyncio.Future[Any]", done: Future) -> None:
        with self._lock:
            wake = not self._arrived
            self._arrived.append((waiter, done))
        if wake:
            self._loop.call_soon_threadsafe(self._settle_arrived)

    def _settle_arrived(self) -> None:
        with self._lock:
            arrived, self._arrived = self._arrived, []
        for waiter, done in arrived:
            if waiter.done():  # cancelled: a timeout, a client gone
                continue
            error = done.exception()
            if error is not None:
                waiter.set_exception(error)
            else:
                waiter.set_result(done.result())


_DELIVERIES: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Deliveries]" = \
    weakref.WeakKeyDictionary()


def _awaitable(future: Future) -> "asyncio.Future[Any]":
    """An asyncio future that follows ``future`` one way: cancelling it (a timeout, a client
    gone) leaves the batching thread's future alone, which ``asyncio.wrap_future`` would
    cancel, and the thread may not then set a cancelled future's result."""
    loop = asyncio.get_running_loop()
    deliveries = _DELIVERIES.get(loop)
    if deliveries is None:
        deliveries = _DELIVERIES[loop] = _Deliveries(loop)
    waiter = loop.create_future()
    future.add_done_callback(lambda done: deliveries.post(waiter, done))
    return waiter


def build_app(predictor: TabularPredictor, request_timeout_s: float = 30.0) -> Starlette:
    prep = predictor.preprocessor

    async def predict(request: Request) -> JSONResponse:
        try:
            table = parse_rows(await _read_body(request), predictor.numerical,
                               predictor.categorical, target=prep.target, max_rows=MAX_ROWS)
            packed = predictor.encode(table)
        except RequestError as exc:
            return _error(exc.status, str(exc))
        except ValueError as exc:  # the preprocessor's own checks name the column and value
            return _error(400, str(exc))
        except ClientDisconnect:
            return _error(400, "the client disconnected before sending the whole body")
        try:
            futures = predictor.submit(packed)
        except RuntimeError as exc:  # the batching thread is closed: the server is stopping
            return _error(503, f"the server is shutting down: {exc}")
        waits = [_awaitable(future) for future in futures]
        try:
            parts = await asyncio.wait_for(asyncio.gather(*waits), timeout=request_timeout_s)
            return JSONResponse(predictor.answer(np.concatenate(parts, axis=0)))
        except asyncio.TimeoutError:
            return _error(504, f"no prediction within {request_timeout_s} s (the model is "
                               f"too slow for the load, or stuck)")
        except Exception as exc:  # noqa: BLE001 - the caller gets the reason, not a traceback
            _log.exception("prediction failed")
            return _error(500, f"the model failed on this request's batch: "
                               f"{type(exc).__name__}: {exc}")

    async def health(request: Request) -> JSONResponse:
        since = {}
        for name in ("pieces_since", "batches_since"):
            text = request.query_params.get(name, "0")
            if not text.isdigit():
                return _error(400, f"{name} must be an integer >= 0, got {text!r}")
            since[name] = int(text)
        return JSONResponse(predictor.describe(**since))

    async def not_json(request: Request, exc: Any) -> JSONResponse:
        status = getattr(exc, "status_code", 500)
        return _error(status, getattr(exc, "detail", None) or "internal error")

    routes = [Route("/predict", predict, methods=["POST"]),
              Route("/health", health, methods=["GET"])]
    return Starlette(routes=routes, exception_handlers={404: not_json, 405: not_json,
                                                        500: not_json})
