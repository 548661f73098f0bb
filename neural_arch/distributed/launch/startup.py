"""What the launcher settles before any worker starts: the command each worker runs, and the
master address the workers meet at.

A script, module or program becomes an argv; a callable target becomes a fresh interpreter
running a spawn-style bootstrap that reads the pickled call from the worker's stdin. The master
port is checked (or, ``--standalone``, chosen) here, so that a port in use or an address no
interface has fails before a worker is started, as a ``LaunchError``.
"""
from __future__ import annotations

import errno
import pickle
import socket
import sys
from multiprocessing import spawn
from typing import List, Optional, Tuple

from ..errors import DistributedError
from .args import LaunchConfig

__all__ = ["LaunchError", "prepare_rendezvous", "worker_command"]

# Runs a callable target the way multiprocessing's "spawn" does: the parent's preparation data
# (sys.path, cwd, main module as __mp_main__) first, then the pickled (function, args). A main
# script may end that import early by raising an exception that carries ``main_namespace``, its
# globals so far (training.launching does at an unguarded training call): they become
# __mp_main__, as spawn would have made them.
SPAWN_BOOTSTRAP = """\
import os, pickle, sys, types
from multiprocessing import process, spawn
process.current_process()._inheriting = True
try:
    spawn.prepare(pickle.load(sys.stdin.buffer))
except BaseException as stopped:
    if getattr(stopped, "main_namespace", None) is None:
        raise
    main = types.ModuleType("__mp_main__")
    main.__dict__.update(stopped.main_namespace)
    sys.modules["__main__"] = sys.modules["__mp_main__"] = main
process.current_process()._inheriting = False
fn, args = pickle.load(sys.stdin.buffer)
sys.stdin = open(os.devnull)
fn(*args)
"""


class LaunchError(DistributedError):
    """The launcher could not start the job (port in use, unresolvable address, exec failure)."""


def worker_command(cfg: LaunchConfig) -> Tuple[List[str], Optional[bytes]]:
    """The argv every worker runs, and the bytes to write to its stdin (None: nothing)."""
    if callable(cfg.target):
        # Raises multiprocessing's own error when called while a spawned child bootstraps
        # its main module, which would otherwise launch workers recursively.
        preparation = spawn.get_preparation_data("launcher-worker")
        # multiprocessing refuses to pickle its key outside its own spawning; it goes down
        # the worker's private stdin pipe just as spawn sends it.
        preparation["authkey"] = bytes(preparation["authkey"])
        try:
            call = pickle.dumps((cfg.target, tuple(cfg.script_args)))
        except (pickle.PicklingError, AttributeError, TypeError) as exc:
            raise TypeError(f"cannot pickle {cfg.target!r} for spawned workers ({exc}); "
                            f"define it at module level and pass picklable args") from None
        return [sys.executable, "-c", SPAWN_BOOTSTRAP], pickle.dumps(preparation) + call
    if cfg.no_python:
        return [cfg.target, *cfg.script_args], None
    if cfg.run_module:
        return [sys.executable, "-u", "-m", cfg.target, *cfg.script_args], None
    return [sys.executable, "-u", cfg.target, *cfg.script_args], None


def prepare_rendezvous(cfg: LaunchConfig) -> None:
    """``--standalone``: pick a free loopback port; else node 0 checks that its port is free."""
    if cfg.standalone:
        cfg.master_addr, cfg.master_port = "127.0.0.1", _free_port("127.0.0.1")
    elif cfg.node_rank == 0:
        _check_port_free(cfg.master_addr, cfg.master_port)


def _free_port(addr: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((addr, 0))
        return sock.getsockname()[1]


def _check_port_free(addr: str, port: int) -> None:
    """Fail before starting workers if rank 0's store could not listen on ``addr:port``."""
    try:
        socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise LaunchError(f"cannot resolve master_addr {addr!r}: {exc}", op="launch") from None
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    # The store listens on the loopback address itself, on every interface otherwise.
    loopback = addr in ("localhost", "::1") or addr.startswith("127.")
    bind_host = addr if loopback else ("::" if family == socket.AF_INET6 else "")
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # TIME_WAIT leftovers of a previous job do not block the store, which reuses them too.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((bind_host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LaunchError(f"master port {port} on {addr} is already in use; pass "
                                  f"--standalone or choose another --master_port",
                                  op="launch") from None
            raise LaunchError(f"cannot bind master_addr {addr!r} port {port} on this node "
                              f"(node_rank 0 must run on the master): {exc}",
                              op="launch") from None
