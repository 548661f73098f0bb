"""The client side of ``bench_serve.py``: closed-loop and open-loop HTTP load on a running
``python -m neural_arch.serve``, and the server's own figures for the measured window.

*Closed loop* (``closed_loop``): each client thread sends its next request as soon as its last
one is answered, so the server is always full; this measures capacity (rows/s), and its latency
is mostly queueing behind the other clients. *Open loop* (``open_loop``): requests are due at
fixed times (Poisson or evenly spaced arrivals at a given rate) whether or not earlier ones are
answered, so below capacity the queue stays short and latency shows the batcher's policy. A
request's client latency runs from the time it was due, not from when a thread got to send it,
so a client that falls behind counts against the figures (``send_lag``) instead of hiding it.

Both read ``GET /health`` as their window opens and summarise the server's records from that
point on: the time each request spent in the batcher (queued, batched, run) and each batch's
model call, measured inside the server without HTTP.
"""
from __future__ import annotations

import http.client
import json
import threading
import time
from typing import Any, Dict, List

import numpy as np

HEADERS = {"Content-Type": "application/json"}


def health(port: int, **since: int) -> Dict[str, Any]:
    query = "&".join(f"{name}={value}" for name, value in since.items())
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/health" + (f"?{query}" if query else ""))
        response = connection.getresponse()
        body = json.loads(response.read())
        if response.status != 200:
            raise RuntimeError(f"GET /health answered {response.status}: {body}")
        return body
    finally:
        connection.close()


def _mark(port: int) -> Dict[str, int]:
    now = health(port)
    return {"pieces_since": now["batcher_latency_ms"]["recorded"],
            "batches_since": now["model_call_ms"]["recorded"]}


def _percentiles_ms(seconds: List[float]) -> Dict[str, float]:
    every = 1e3 * np.asarray(seconds)
    if not len(every):
        raise RuntimeError("no request completed in the measured window")
    p50, p99 = np.percentile(every, [50, 99])
    return {"p50": float(p50), "p99": float(p99), "max": float(every.max())}


def _server_window(port: int, since: Dict[str, int], rows: int) -> Dict[str, Any]:
    after = health(port, **since)
    batcher, model = after["batcher_latency_ms"], after["model_call_ms"]
    return {"batcher": {k: batcher[k] for k in ("p50", "p99", "max")},
            "model_call": {k: model[k] for k in ("p50", "p99", "max")},
            "batch_rows": batcher["count"] * rows / max(model["count"], 1)}


def _post(connection: http.client.HTTPConnection, body: bytes) -> None:
    connection.request("POST", "/predict", body=body, headers=HEADERS)
    response = connection.getresponse()
    answer = response.read()
    if response.status != 200:
        raise RuntimeError(f"POST /predict answered {response.status}: {answer[:200]!r}")


def _run_threads(threads: List[threading.Thread], port: int, opens_at: float,
                 join_s: float) -> Dict[str, int]:
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, opens_at - time.monotonic()))
    since = _mark(port)
    for thread in threads:
        thread.join(timeout=join_s)
    if any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"client threads still running {join_s:.0f} s after the window")
    return since


def closed_loop(port: int, bodies: List[bytes], clients: int, rows: int, warmup: float,
                seconds: float) -> Dict[str, Any]:
    """``clients`` threads back to back; the requests that start in the measured window."""
    latencies: List[List[float]] = [[] for _ in range(clients)]
    errors: List[str] = []
    begin = time.monotonic() + warmup
    end = begin + seconds

    def client(c: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            i = c
            while True:
                start = time.monotonic()
                if start >= end:
                    return
                _post(connection, bodies[i % len(bodies)])
                if start >= begin:
                    latencies[c].append(time.monotonic() - start)
                i += clients
        except Exception as exc:  # noqa: BLE001 - reported once all threads are done
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    since = _run_threads(threads, port, begin, seconds + 60)
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed, e.g. {errors[0]}")
    every = [x for per_client in latencies for x in per_client]
    return {"rows_per_s": len(every) * rows / seconds, "requests": len(every),
            "client": _percentiles_ms(every), **_server_window(port, since, rows)}


def arrival_times(rate_per_s: float, duration_s: float, arrivals: str,
                  seed: int = 0) -> np.ndarray:
    """Seconds from the start at which requests are due: ``"poisson"`` (exponential gaps, as
    independent users arrive) or ``"even"`` (one every ``1 / rate_per_s``)."""
    if not rate_per_s > 0:
        raise ValueError(f"the open-loop rate must be > 0 requests/s, got {rate_per_s}")
    count = int(duration_s * rate_per_s * 1.2) + 10
    if arrivals == "poisson":
        gaps = np.random.default_rng(seed).exponential(1.0 / rate_per_s, size=count)
    elif arrivals == "even":
        gaps = np.full(count, 1.0 / rate_per_s)
    else:
        raise ValueError(f"arrivals must be 'poisson' or 'even', got {arrivals!r}")
    times = np.cumsum(gaps)
    return times[times < duration_s]


def open_loop(port: int, bodies: List[bytes], rate_per_s: float, rows: int, warmup: float,
              seconds: float, connections: int, arrivals: str) -> Dict[str, Any]:
    """Requests due at ``rate_per_s`` for ``warmup + seconds``, sent by ``connections`` threads
    on kept-alive connections (each takes the next due request when free); the requests due in
    the measured window."""
    due = arrival_times(rate_per_s, warmup + seconds, arrivals)
    latencies, lags, errors = [], [], []
    claim = threading.Lock()
    state = {"next": 0}
    start = time.monotonic() + 0.2  # every thread started and connected

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        try:
            while True:
                with claim:
                    i = state["next"]
                    state["next"] += 1
                if i >= len(due):
                    return
                target = start + due[i]
                time.sleep(max(0.0, target - time.monotonic()))
                sent = time.monotonic()
                _post(connection, bodies[i % len(bodies)])
                if due[i] >= warmup:  # list.append is atomic: the threads share the lists
                    latencies.append(time.monotonic() - target)
                    lags.append(sent - target)
        except Exception as exc:  # noqa: BLE001 - reported once all threads are done
            errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            connection.close()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(connections)]
    since = _run_threads(threads, port, start + warmup, warmup + seconds + 60)
    if errors:
        raise RuntimeError(f"{len(errors)} clients failed, e.g. {errors[0]}")
    return {"offered_rows_per_s": rate_per_s * rows,
            "rows_per_s": len(latencies) * rows / seconds, "requests": len(latencies),
            "client": _percentiles_ms(latencies), "send_lag": _percentiles_ms(lags),
            **_server_window(port, since, rows)}
