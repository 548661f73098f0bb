"""``python -m neural_arch.serve``: load a model folder, bind, serve until SIGTERM or SIGINT.

The model is loaded before the port is bound, so a bad folder ends the command at once (exit
status 2, one line on stderr), as do arguments out of range and a port that cannot be bound.
Once bound, one line goes to stdout, ``listening on http://HOST:PORT``, with the port the
system chose for ``--port 0``. SIGTERM or SIGINT stops the server as uvicorn does (no new
connections, requests in flight answered, at most ``--graceful-timeout`` seconds), then the
batching thread answers what it holds and stops; the command then exits 0, leaving no process.
"""
from __future__ import annotations

import argparse
import signal
import socket
import sys
from typing import List, Optional

__all__ = ["main"]

_PROG = "python -m neural_arch.serve"


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text}")
    return value


def _port(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"must be in 0..65535 (0: any free port), got {text}")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=_PROG, description="Serve a TabGPT folder written by "
                                     "save_pretrained: POST /predict (JSON rows), GET /health.")
    parser.add_argument("--model", required=True, help="the save_pretrained folder (config.json, "
                        "model.safetensors, preprocessor.json)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=_port, default=8000, help="0: any free port (printed)")
    parser.add_argument("--max-batch-size", type=_positive_int, default=64,
                        help="rows per model call at most")
    parser.add_argument("--timeout-ms", type=_non_negative, default=5.0,
                        help="how long a request waits for others to share its batch")
    parser.add_argument("--request-timeout", type=_non_negative, default=30.0,
                        help="seconds before a request is answered 504")
    parser.add_argument("--graceful-timeout", type=_non_negative, default=10.0,
                        help="seconds requests in flight get at shutdown")
    parser.add_argument("--log-level", default="warning",
                        choices=["critical", "error", "warning", "info", "debug"])
    return parser


def _fail(message: str) -> int:
    print(f"{_PROG}: {message}", file=sys.stderr, flush=True)
    return 2


def _bind(host: str, port: int) -> socket.socket:
    family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
    except OSError:
        sock.close()
        raise
    return sock


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    try:
        import uvicorn

        from .app import build_app
    except ImportError as exc:
        return _fail(f"needs the serve extra ({exc}): pip install \"neural-arch[serve]\"")
    from .predictor import ModelFolderError, TabularPredictor, load_servable

    try:
        model, preprocessor = load_servable(args.model)
    except ModelFolderError as exc:
        return _fail(str(exc))
    predictor = TabularPredictor(model, preprocessor, max_batch_size=args.max_batch_size,
                                 timeout_ms=args.timeout_ms)
    predictor.warm_up()
    try:
        sock = _bind(args.host, args.port)
    except OSError as exc:
        predictor.close()
        return _fail(f"cannot listen on {args.host}:{args.port}: {exc}")
    host, port = sock.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    config = uvicorn.Config(build_app(predictor, request_timeout_s=args.request_timeout),
                            log_level=args.log_level, access_log=False, lifespan="off",
                            timeout_graceful_shutdown=args.graceful_timeout)
    server = uvicorn.Server(config)

    # uvicorn re-raises the signal that stopped it once it is done; with this handler that
    # returns here instead of killing the process before the batching thread is closed (and a
    # signal before uvicorn takes over still stops it)
    def stop(number: int, frame: object) -> None:
        server.should_exit = True

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    print(f"listening on http://{shown}:{port}", flush=True)
    try:
        server.run(sockets=[sock])
    finally:
        predictor.close()
        sock.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
