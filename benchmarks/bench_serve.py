"""Load test of ``python -m neural_arch.serve``: throughput and latency at max batch 1, 8, 64.

A TabGPT (wine columns, ``--d-token`` 32, 2 blocks, 4 heads, a few training steps: the weights'
quality does not matter here) is saved to a temporary folder and served by the real command,
once per ``--batch-sizes`` entry, with ``--timeout-ms``. ``--clients`` threads, each on its own
kept-alive connection, send requests of ``--rows`` rows back to back (a closed loop) for
``--seconds`` after ``--warmup`` seconds. Reported per max batch: rows/s, p50 and p99 of the
request latency seen by the client and of the time a request spends in the batcher (queued,
batched, run: the server's ``GET /health``, over the whole run), the batches' mean rows, one
batch's compute (the model on max batch rows, measured in this process) and the bound
``timeout_ms + one batch's compute``, which holds for the batcher's time while no more rows
wait than a batch takes; then the throughput gain of the largest max batch over the smallest.
The clients run on the same machine as the server and take CPU from it.

    python benchmarks/bench_serve.py [--batch-sizes 1 8 64] [--clients 32] [--rows 1]
        [--timeout-ms 5] [--seconds 10] [--warmup 1] [--quick]
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path[:0] = [HERE, ROOT, os.path.join(ROOT, "tests", "serve")]  # serve_support

import bench_common as common  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
import http.client  # noqa: E402
import json  # noqa: E402
import tempfile  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Sequence  # noqa: E402

import numpy as np  # noqa: E402

from neural_arch.core import no_grad  # noqa: E402
from neural_arch.data.tabular import load_bundled  # noqa: E402
from serve_support import Server, train_and_save  # noqa: E402

START_TIMEOUT_S = 60.0


def save_model(folder: str, d_token: int):
    """A briefly trained wine classifier in ``folder``; (model, its encoded rows, the table's
    rows as JSON objects)."""
    table, target = load_bundled("wine")
    model, _, rows = train_and_save(folder, table, target, steps=4, lr=1e-3, d_token=d_token,
                                    n_layers=2, n_heads=4)
    names = [name for name in table if name != target]
    json_rows = [{name: float(table[name][i]) for name in names}
                 for i in range(len(table[target]))]
    return model, rows, json_rows


def batch_compute_ms(model, rows, batch: int, repeats: int = 20) -> float:
    """Median milliseconds of one model call on ``batch`` rows (after one warm-up call)."""
    x_num, x_cat = rows.x_num[:batch], rows.x_cat[:batch]
    times = []
    with no_grad():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(x_num, x_cat)
            times.append(time.perf_counter() - start)
    return 1e3 * float(np.median(times[1:]))


def health(port: int) -> Dict[str, Any]:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", "/health")
        return json.loads(connection.getresponse().read())
    finally:
        connection.close()


def load(port: int, bodies: List[bytes], clients: int, rows: int, warmup: float,
         seconds: float) -> Dict[str, float]:
    """Closed-loop clients; latencies of the requests that start in the measured window."""
    latencies: List[List[float]] = [[] for _ in range(clients)]
    errors: List[str] = []
    begin = time.monotonic() + warmup
    end = begin + seconds

    def client(c: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        headers = {"Content-Type": "application/json"}
        try:
            i = c
            while True:
                start = time.monotonic()
                if start >= end:
                    return
                connection.request("POST", "/predict", body=bodies[i % len(bodies)],
                                   headers=headers)
                response = connection.getresponse()
                body = response.read()
                if response.status != 200:
                    errors.append(f"{response.status}: {body[:200]!r}")
                    return
                if start >= begin:
                    latencies[c].append(time.monotonic() - start)
                i += clients
        finally:
            connection.close()

    threads = [threading.Thread(target=client, args=(c,), daemon=True) for c in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, begin - time.monotonic()))
    batches_before = health(port)["batches_run"]
    for thread in threads:
        thread.join(timeout=seconds + warmup + 60)
    after = health(port)
    batches = after["batches_run"] - batches_before
    if errors:
        raise RuntimeError(f"{len(errors)} requests failed, e.g. {errors[0]}")
    every = np.array([x for per_client in latencies for x in per_client])
    requests = len(every)
    return {"rows_per_s": requests * rows / seconds, "requests": requests,
            "p50_ms": 1e3 * float(np.percentile(every, 50)),
            "p99_ms": 1e3 * float(np.percentile(every, 99)),
            "batch_rows": requests * rows / max(batches, 1),
            "batcher_p50_ms": after["batcher_latency_ms"]["p50"],
            "batcher_p99_ms": after["batcher_latency_ms"]["p99"]}


def main(argv: Sequence[str] = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 64])
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--rows", type=int, default=1, help="rows per request")
    parser.add_argument("--timeout-ms", type=float, default=5.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--d-token", type=int, default=32)
    parser.add_argument("--quick", action="store_true", help="2 s per max batch, 0.5 s warm-up")
    args = parser.parse_args(argv)
    if args.quick:
        args.seconds, args.warmup = 2.0, 0.5
    print("python benchmarks/bench_serve.py " + " ".join(sys.argv[1:] if argv is None
                                                           else argv), flush=True)
    with tempfile.TemporaryDirectory() as folder:
        model, rows, json_rows = save_model(folder, args.d_token)
        bodies = [json.dumps(json_rows[i:i + args.rows]).encode()
                  for i in range(0, len(json_rows) - args.rows + 1, args.rows)]
        results = {}
        for max_batch in args.batch_sizes:
            server = Server(folder, "--max-batch-size", str(max_batch), "--timeout-ms",
                            str(args.timeout_ms), start_timeout=START_TIMEOUT_S)
            try:
                results[max_batch] = load(server.port, bodies, args.clients, args.rows,
                                          args.warmup, args.seconds)
            finally:
                server.stop()
            compute = batch_compute_ms(model, rows, max_batch)
            results[max_batch].update(compute_ms=compute, bound_ms=args.timeout_ms + compute)
            print(f"max batch {max_batch}: {results[max_batch]}", flush=True)
    print(f"\n{args.clients} clients, {args.rows} row(s) per request, timeout {args.timeout_ms} "
          f"ms, {args.seconds} s per max batch; TabGPT d_token {args.d_token}, 2 blocks, "
          f"wine's 13 columns")
    print("| max batch | rows/s | client p50 ms | client p99 ms | batcher p50 ms | "
          "batcher p99 ms | bound: timeout + one batch's compute, ms | rows per batch |")
    print("|---|---|---|---|---|---|---|---|")
    for max_batch, r in results.items():
        print(f"| {max_batch} | {r['rows_per_s']:.0f} | {r['p50_ms']:.1f} | {r['p99_ms']:.1f} | "
              f"{r['batcher_p50_ms']:.1f} | {r['batcher_p99_ms']:.1f} | "
              f"{args.timeout_ms:g} + {r['compute_ms']:.1f} = {r['bound_ms']:.1f} | "
              f"{r['batch_rows']:.1f} |")
    low, high = min(results), max(results)
    if low != high:
        print(f"\nthroughput gain of max batch {high} over {low}: "
              f"{results[high]['rows_per_s'] / results[low]['rows_per_s']:.2f}x")


if __name__ == "__main__":
    main()
