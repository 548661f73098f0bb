"""One rank of an all-reduce job that a fault is injected into (``fault_injector`` starts it).

Run as a script, it joins the process group, then all-reduces an array in a tight loop
(checking every result exactly), so a fault lands mid-collective. When a collective fails it
records the error (type, text, peer, operation, sequence number, time) in ``--out`` and exits 1.

The injector and the ranks talk through files in ``--out`` and the environment:
``started_<R>.json`` (the rank runs), ``looping_<R>.json`` (it has all-reduced three times),
``error_<R>.json`` / ``done_<R>.json`` (how its loop ended), ``stop`` (every rank ends its loop),
``injected.json`` (when a fault the victim brings about itself happened). ``FAULT_RANK`` and
``FAULT_OWN`` name a rank that leaves its program (``exit`` or ``raise``) once ``fault_now``
appears; ``FAULT_CLOSE_SOCKET_RANK`` one that shuts its connection to the next rank once
``close_socket`` appears; ``FAULT_STOP_EARLY_RANK`` one that stops itself (SIGSTOP) right after
``init_process_group``. With ``--group`` only those ranks loop, on ``new_group``; the others
wait idle.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Optional

ELEMENTS = 50_000


def _write_json(path: Path, payload: dict) -> None:
    path.with_suffix(".tmp").write_text(json.dumps(payload))
    path.with_suffix(".tmp").rename(path)


def _close_socket_on_trigger(out: Path, rank: int, world_size: int) -> None:
    """Shut down this rank's connection to the next rank once the trigger file appears."""
    from neural_arch.distributed.group.world import world
    while not (out / "close_socket").exists():
        time.sleep(0.005)
    peer, injected = (rank + 1) % world_size, time.time()
    world().transport._socks[peer].shutdown(socket.SHUT_RDWR)
    _write_json(out / "injected.json", {"time": injected, "peer": peer})


class InjectedError(RuntimeError):
    """The exception the ``raise`` fault lets escape, as a bug in the training script would."""


def _leave_on_trigger(out: Path, fault: str) -> None:
    """The ``exit`` and ``raise`` faults: once told to, leave the program as ``fault`` says."""
    if not (out / "fault_now").exists():
        return
    _write_json(out / "injected.json", {"time": time.time()})
    if fault == "exit":
        sys.exit(0)  # atexit hooks run, as when a script simply ends
    raise InjectedError("the training script failed")


def _stop_now(out: Path) -> None:
    """Stop this process (SIGSTOP) right after noting when, as a hung rank would."""
    _write_json(out / "injected.json", {"time": time.time(), "pid": os.getpid()})
    os.kill(os.getpid(), signal.SIGSTOP)


def worker(out: Path, backend: str, elements: int, seconds: float, timeout: float,
           group: Optional[list] = None) -> int:
    import numpy as np
    from neural_arch import distributed as dist
    rank = int(os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    world_size = int(os.environ.get("WORLD_SIZE", os.environ.get("OMPI_COMM_WORLD_SIZE", "1")))
    own_fault = os.environ.get("FAULT_OWN") if rank == int(os.environ.get("FAULT_RANK", "-1")) \
        else None
    # see fault_injector.start_ranks
    _write_json(out / f"started_{rank}.json", {"pid": os.getpid()})
    dist.init_process_group(backend=backend, timeout=timeout)
    if rank == int(os.environ.get("FAULT_STOP_EARLY_RANK", "-1")):
        _stop_now(out)
    if rank == int(os.environ.get("FAULT_CLOSE_SOCKET_RANK", "-1")):
        threading.Thread(target=_close_socket_on_trigger, args=(out, rank, world_size),
                         daemon=True).start()
    members = list(range(world_size)) if group is None else group
    subgroup = None if group is None else dist.new_group(members)
    stop_at, step = time.monotonic() + seconds, 0
    if rank not in members:  # idle until the job ends; a fault may be injected here
        _write_json(out / f"looping_{rank}.json", {"pid": os.getpid()})
        while time.monotonic() < stop_at and not (out / "stop").exists():
            time.sleep(0.05)
        dist.destroy_process_group()
        return 0
    base = np.arange(elements, dtype=np.float64) % 1000.0
    expected = base * sum(r + 1 for r in members)
    x = np.empty(elements + 1)
    try:
        while True:
            # The last element carries each rank's wish to stop, so all stop at the same step.
            x[:elements] = base * (rank + 1)
            x[elements] = time.monotonic() > stop_at or (out / "stop").exists()
            if own_fault and step >= 3:
                _leave_on_trigger(out, own_fault)
            dist.all_reduce(x, group=subgroup)
            if not np.array_equal(x[:elements], expected):
                raise AssertionError(f"rank {rank} step {step}: all_reduce result differs")
            step += 1
            if x[elements]:
                break
            if step == 3:
                _write_json(out / f"looping_{rank}.json", {"pid": os.getpid()})
    except Exception as e:
        if isinstance(e, InjectedError):
            raise
        _write_json(out / f"error_{rank}.json", {
            "time": time.time(), "type": type(e).__name__, "message": str(e),
            "peer": getattr(e, "peer", None), "op": getattr(e, "op", None),
            "seq": getattr(e, "seq", None), "steps": step})
        return 1
    _write_json(out / f"done_{rank}.json", {
        "steps": step, "result_sum": float(x[:elements].sum()), "pid": os.getpid(),
        "net_namespace": os.stat("/proc/self/ns/net").st_ino})
    dist.destroy_process_group()
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--backend", default="tcp")
    parser.add_argument("--elements", type=int, default=ELEMENTS)
    parser.add_argument("--seconds", type=float, default=90.0)
    parser.add_argument("--timeout", type=float, default=120.0,
                        help="collective timeout: far above the detection times measured")
    parser.add_argument("--group", default=None,
                        help="comma-separated ranks that loop on new_group(GROUP)")
    args = parser.parse_args(argv)
    group = None if args.group is None else [int(r) for r in args.group.split(",")]
    return worker(args.out, args.backend, args.elements, args.seconds, args.timeout, group)


if __name__ == "__main__":
    sys.exit(main())
