"""Inject a fault into a running all-reduce job and measure how each survivor learns of it.

Run as a script, it is one rank of the job: it joins the process group, then all-reduces an
array in a tight loop (checking every result exactly), so a fault lands mid-collective. When a
collective fails it records the error (type, text, peer, operation, sequence number, time) in
``--out`` and exits 1.

Imported, ``run_fault(fault, backend, world_size, victim, workdir)`` starts the ranks, waits
until all of them loop, injects the fault into ``victim`` and returns a ``FaultOutcome``:
``kill`` (SIGKILL), ``stop`` (SIGSTOP: a hung rank), ``close_socket`` (the victim shuts down its
TCP connection to the next rank while a collective runs), ``stop_early`` (the victim stops
itself right after ``init_process_group``, before its first collective, while its heartbeat is
still connecting). With ``group=[...]`` only those ranks loop, on ``new_group(group)``; the
others wait idle, so a fault in one of them hits a job whose collectives do not involve it.
Every process is killed and reaped before it returns; leftover processes and shared-memory
segments are reported, not hidden.
"""
from __future__ import annotations

import argparse
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

FAULTS = ("kill", "stop", "close_socket", "stop_early")
ELEMENTS = 50_000
_READY_LIMIT_S = 60.0


# ----- one rank ----------------------------------------------------------------------------------
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


def _stop_now(out: Path) -> None:
    """Stop this process (SIGSTOP) right after noting when, as a hung rank would."""
    _write_json(out / "injected.json", {"time": time.time(), "pid": os.getpid()})
    os.kill(os.getpid(), signal.SIGSTOP)


def worker(out: Path, backend: str, elements: int, seconds: float, timeout: float,
           group: Optional[list] = None) -> int:
    import numpy as np
    from neural_arch import distributed as dist
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
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
            dist.all_reduce(x, group=subgroup)
            if not np.array_equal(x[:elements], expected):
                raise AssertionError(f"rank {rank} step {step}: all_reduce result differs")
            step += 1
            if x[elements]:
                break
            if step == 3:
                _write_json(out / f"looping_{rank}.json", {"pid": os.getpid()})
    except Exception as e:
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


# ----- the injector ------------------------------------------------------------------------------
@dataclass
class FaultOutcome:
    fault: str
    backend: str
    world_size: int
    victim: int
    injected_at: float
    errors: dict = field(default_factory=dict)  # rank -> what its failed collective raised
    exit_codes: dict = field(default_factory=dict)
    leftover_pids: list = field(default_factory=list)
    leftover_segments: list = field(default_factory=list)
    logs: str = ""

    @property
    def survivors(self) -> list:
        return [r for r in range(self.world_size) if r != self.victim]

    def detection_s(self, rank: int) -> Optional[float]:
        error = self.errors.get(rank)
        return None if error is None else error["time"] - self.injected_at

    @property
    def worst_detection_s(self) -> Optional[float]:
        times = [self.detection_s(r) for r in self.survivors]
        return None if None in times else max(times)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def _wait_for(predicate, limit: float, procs) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if predicate():
            return True
        if procs is not None and any(p.poll() is not None for p in procs):
            return predicate()
        time.sleep(0.01)
    return predicate()


def run_fault(fault: str, backend: str, world_size: int, victim: int, workdir: Path,
              detect_limit: float = 30.0, env: Optional[dict] = None,
              group: Optional[list] = None) -> FaultOutcome:
    """Start the job, inject ``fault`` into rank ``victim``, collect what every rank saw.

    ``group``: the ranks that loop on ``new_group(group)`` (default: all, on the world group).
    """
    if fault not in FAULTS:
        raise ValueError(f"fault must be one of {FAULTS}, got {fault!r}")
    if not 0 <= victim < world_size:
        raise ValueError(f"victim {victim} is outside [0, {world_size})")
    if group is not None and (len(set(group)) != len(group) or len(group) < 2
                              or not all(0 <= r < world_size for r in group)):
        raise ValueError(f"group must hold 2 or more distinct ranks of [0, {world_size}), "
                         f"got {group!r}")
    if fault == "stop_early" and group is not None:
        raise ValueError("stop_early stops the victim before new_group: use no group with it")
    out = Path(workdir)
    out.mkdir(parents=True, exist_ok=True)
    port, secret = _free_port(), secrets.token_hex(16)
    base_env = {**os.environ, "WORLD_SIZE": str(world_size), "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port), "NEURAL_ARCH_SECRET": secret,
                "LOCAL_WORLD_SIZE": str(world_size), **(env or {})}
    if fault == "close_socket":
        base_env["FAULT_CLOSE_SOCKET_RANK"] = str(victim)
    if fault == "stop_early":
        base_env["FAULT_STOP_EARLY_RANK"] = str(victim)
    extra = [] if group is None else ["--group", ",".join(str(r) for r in group)]
    procs = []
    outcome = FaultOutcome(fault, backend, world_size, victim, 0.0)
    try:
        for rank in range(world_size):
            log = open(out / f"rank{rank}.log", "wb")
            procs.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--out", str(out), "--backend",
                 backend, *extra], env={**base_env, "RANK": str(rank), "LOCAL_RANK": str(rank)},
                stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
            log.close()
        if fault == "stop_early":  # the victim stops itself; the others may never loop
            ready = lambda: (out / "injected.json").exists()
        else:
            ready = lambda: all((out / f"looping_{r}.json").exists() for r in range(world_size))
        if not _wait_for(ready, _READY_LIMIT_S, procs):
            raise RuntimeError(f"the job did not start looping:\n{_logs(out, world_size)}")
        outcome.injected_at = _inject(fault, procs[victim], out)
        survivors = [r for r in range(world_size) if r != victim]
        _wait_for(lambda: all((out / f"error_{r}.json").exists() or procs[r].poll() is not None
                              for r in survivors), detect_limit, None)
    finally:
        pids = [p.pid for p in procs]
        _stop_all(procs, victim)
    for rank in range(world_size):
        path = out / f"error_{rank}.json"
        if path.exists():
            outcome.errors[rank] = json.loads(path.read_text())
        outcome.exit_codes[rank] = procs[rank].returncode
    outcome.leftover_pids = [pid for pid in pids if _alive(pid)]
    outcome.leftover_segments = segments_of(pids)
    outcome.logs = _logs(out, world_size)
    return outcome


def _inject(fault: str, victim, out: Path) -> float:
    if fault == "stop_early":  # done already, by the victim itself
        return json.loads((out / "injected.json").read_text())["time"]
    if fault == "close_socket":
        (out / "close_socket").touch()
        if not _wait_for(lambda: (out / "injected.json").exists(), 10.0, None):
            raise RuntimeError("the victim did not close its socket")
        return json.loads((out / "injected.json").read_text())["time"]
    injected = time.time()
    os.kill(victim.pid, signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
    return injected


def _stop_all(procs, victim: int) -> None:
    """Kill the victim, let the survivors exit on their own briefly, then kill what is left."""
    if victim < len(procs) and procs[victim].poll() is None:
        os.killpg(procs[victim].pid, signal.SIGKILL)  # works on a stopped process too
    deadline = time.monotonic() + 15.0
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for proc in procs:
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(timeout=10)


def segments_of(pids) -> list:
    """Shared-memory segments in /dev/shm created by any of ``pids`` (named nf_<pid>_...)."""
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return []
    prefixes = tuple(f"nf_{pid}_" for pid in pids)
    return sorted(n for n in names if n.startswith(prefixes))


def _logs(out: Path, world_size: int) -> str:
    parts = []
    for rank in range(world_size):
        path = out / f"rank{rank}.log"
        if path.exists():
            parts.append(f"--- rank {rank} ---\n" + path.read_text(errors="replace")[-3000:])
    return "\n".join(parts)


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
