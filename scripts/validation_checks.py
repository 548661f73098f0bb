"""The worker side of the distributed validation: the check runner, its helpers, and the
fault-detection run.

Every rank runs the same checks in the same order. A check issues all of its collectives before
it compares anything, so a wrong value on one rank never leaves the ranks out of step; it then
returns a line of details, or raises ``CheckFailed`` naming what differed. Each rank writes its
verdicts to ``<work_dir>/<phase>_rank<R>.json`` after every check, so a rank that dies still
leaves what it had found. The parent counts a check as passed only if every rank passed it.

``NEURAL_ARCH_VALIDATE_INJECT_FAULT=<check name>`` makes the last rank corrupt its contribution
to that check, which proves the check can fail (several names, comma-separated: each of those
checks); ``<check name>:crash`` makes it SIGKILL itself as that check starts, which proves a
crash is reported rather than waited on.
"""
from __future__ import annotations

import hashlib
import json
import os
import signal
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import numpy as np

INJECT_VAR = "NEURAL_ARCH_VALIDATE_INJECT_FAULT"
# SKIPPED: the check could not run here (its backend's launcher or library is missing).
PASSED, FAILED, SKIPPED = "PASSED", "FAILED", "SKIPPED"
FAULT_CHECK = "fault_detection"
FAULT_KILL_AT = 5  # the victim dies before this iteration of the collective loop
FAULT_ITERATIONS = 200
FAULT_DETECTION_LIMIT_S = 10.0


class CheckFailed(AssertionError):
    """A check ran to the end but found results that differ from the reference."""


@dataclass
class Context:
    """What a check needs to know about this rank and the run the parent asked for."""

    rank: int
    world_size: int
    backend: str  # as requested: shm, tcp, mpi, auto or gloo
    work_dir: Path
    inject: Optional[str] = None

    def __post_init__(self) -> None:
        self.faults = injected_faults(self.inject)  # read once; the parent refused bad names

    def _injected(self, fault: str) -> bool:
        return self.rank == self.world_size - 1 and fault in self.faults

    def corrupt(self, check: str) -> bool:
        """Whether this rank must spoil its contribution to ``check`` (fault injection)."""
        return self._injected(check)

    def crash_before(self, check: str) -> None:
        """Die without a word when a crash of this rank is injected at ``check``."""
        if self._injected(f"{check}:crash"):
            os.kill(os.getpid(), signal.SIGKILL)


def injected_faults(value: Optional[str]) -> list[str]:
    """The faults ``value`` (``NEURAL_ARCH_VALIDATE_INJECT_FAULT``) names: check names, or
    ``<check name>:crash``, comma-separated; ValueError naming any that is not a check."""
    if not value:
        return []
    faults = [fault.strip() for fault in value.split(",")]
    known = [name for name, _ in check_list()] + [FAULT_CHECK]
    unknown = [f for f in faults if f.removesuffix(":crash") not in known]
    if unknown:
        raise ValueError(f"{INJECT_VAR}={value!r} names no check in {unknown}; the checks are "
                         f"{', '.join(known)} (each may end in ':crash')")
    return faults


class Problems:
    """Collects mismatches found by a check; keeps the first few for the report."""

    def __init__(self, keep: int = 3) -> None:
        self.keep, self.count, self.items = keep, 0, []

    def add(self, text: str) -> None:
        self.count += 1
        if len(self.items) < self.keep:
            self.items.append(text)

    def expect_equal(self, got, want, what: str) -> None:
        """Exact comparison: same dtype, same shape, same values."""
        got, want = np.asarray(got), np.asarray(want)
        if got.dtype != want.dtype or got.shape != want.shape:
            self.add(f"{what}: got {got.shape} {got.dtype}, expected {want.shape} {want.dtype}")
        elif not np.array_equal(got, want):
            bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
            i = int(bad[0])
            self.add(f"{what}: {bad.size} of {want.size} elements wrong, first at [{i}]: "
                     f"got {got.reshape(-1)[i].item()!r}, expected {want.reshape(-1)[i].item()!r}")

    def expect(self, condition: bool, text: str) -> None:
        if not condition:
            self.add(text)

    def verdict(self, details: str) -> str:
        if self.count:
            more = f" (+{self.count - len(self.items)} more)" if self.count > len(self.items) else ""
            raise CheckFailed(f"{self.count} mismatch(es): " + "; ".join(self.items) + more)
        return details


def digest(*arrays: np.ndarray) -> str:
    h = hashlib.sha256()
    for arr in arrays:
        h.update(str(arr.dtype).encode() + str(arr.shape).encode())
        h.update(np.ascontiguousarray(arr).tobytes())
    return h.hexdigest()


def agree_across_ranks(value: str, what: str, problems: Problems) -> None:
    """All-gather ``value`` (a digest) and report ranks whose value differs from rank 0's."""
    from neural_arch.distributed import all_gather_object
    everyone = all_gather_object(value)
    odd = [r for r, v in enumerate(everyone) if v != everyone[0]]
    if odd:
        problems.add(f"{what} differ between ranks: rank 0 has {everyone[0][:12]}, "
                     + ", ".join(f"rank {r} has {everyone[r][:12]}" for r in odd))


def check_environment(ctx: Context) -> str:
    """Rank, world size, local rank and backend agree with the launch; ranks are distinct."""
    from neural_arch.distributed import all_gather_object, get_distributed_info, get_rank
    from neural_arch.distributed.transports import available_transports
    info = get_distributed_info()
    problems = Problems()
    wanted = ctx.backend
    if wanted in ("auto", "gloo"):  # every rank runs on this host
        wanted = "shm" if "shm" in available_transports() else "tcp"
    launched_as = os.environ.get("RANK", os.environ.get("OMPI_COMM_WORLD_RANK"))
    launched_local = os.environ.get("LOCAL_RANK", os.environ.get("OMPI_COMM_WORLD_LOCAL_RANK"))
    rank = info["rank"] if not ctx.corrupt("environment") else (info["rank"] + 1) % ctx.world_size
    for key, got, want in (("initialized", info["initialized"], True),
                           ("world_size", info["world_size"], ctx.world_size),
                           ("backend", info["backend"], wanted),
                           ("rank", info["rank"], get_rank()),
                           ("launcher rank", str(info["rank"]), launched_as),
                           ("local_rank", str(info["local_rank"]), launched_local)):
        problems.expect(got == want, f"{key} is {got!r}, expected {want!r}")
    everyone = all_gather_object((rank, info["local_rank"], os.getpid(), info["host"]))
    ranks = [e[0] for e in everyone]
    problems.expect(ranks == list(range(ctx.world_size)),
                    f"all_gather_object of the ranks gave {ranks}, expected 0..{ctx.world_size - 1}")
    locals_ = sorted(e[1] for e in everyone)
    if len({e[3] for e in everyone}) == 1:  # one host: local ranks are a permutation
        problems.expect(locals_ == list(range(ctx.world_size)),
                        f"local ranks {locals_} are not 0..{ctx.world_size - 1}")
    pids = {(e[2], e[3]) for e in everyone}
    problems.expect(len(pids) == ctx.world_size, f"{len(pids)} distinct processes, expected "
                                                 f"{ctx.world_size}")
    return problems.verdict(f"ranks 0..{ctx.world_size - 1} in {len(pids)} processes, backend "
                            f"{info['backend']}, local ranks {locals_}")


def check_list() -> list[tuple[str, Callable[[Context], str]]]:
    """The checks of the main run, in the order every rank runs them."""
    import validation_collectives as col
    import validation_messaging as msg
    import validation_training as train
    return [("environment", check_environment), ("all_reduce", col.check_all_reduce),
            ("broadcast", col.check_broadcast), ("all_gather", col.check_all_gather),
            ("reduce_scatter", col.check_reduce_scatter), ("reduce", col.check_reduce),
            ("gather", col.check_gather), ("scatter", col.check_scatter),
            ("send_recv", msg.check_send_recv), ("barrier", msg.check_barrier),
            ("all_gather_object", msg.check_all_gather_object),
            ("broadcast_object_list", msg.check_broadcast_object_list),
            ("async_ops", msg.check_async_ops), ("ddp_manual", train.check_ddp_manual),
            ("ddp_automatic", train.check_ddp_automatic), ("sampling", train.check_sampling),
            ("checkpoint", train.check_checkpoint)]


def write_json(path: Path, payload: dict) -> None:
    """Atomic write: the parent never reads half a file."""
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps(payload, indent=1))
    os.replace(tmp, path)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, CheckFailed):
        return str(exc)
    where = traceback.extract_tb(exc.__traceback__)
    line = f" (at {Path(where[-1].filename).name}:{where[-1].lineno})" if where else ""
    return f"{type(exc).__name__}: {exc}{line}"


def run_main(ctx: Context, backend: str, pg_timeout: float) -> int:
    """Join the group and run every check; returns the process exit code."""
    from neural_arch import distributed as dist
    out = ctx.work_dir / f"main_rank{ctx.rank}.json"
    results: list[dict] = []
    try:
        dist.init_process_group(backend=backend, timeout=pg_timeout)
    except Exception as exc:  # every check fails with the reason; stop the job quickly
        reason = f"init_process_group({backend!r}) failed: {_describe(exc)}"
        write_json(out, {"rank": ctx.rank, "checks": [
            {"name": n, "status": FAILED, "seconds": 0.0, "details": reason}
            for n, _ in check_list()]})
        return 1
    broken = None
    for name, fn in check_list():
        start = time.perf_counter()
        if broken is not None:
            status, details = FAILED, f"not run: the process group failed during {broken}"
        else:
            try:
                ctx.crash_before(name)
                status, details = PASSED, fn(ctx)
            except Exception as exc:
                status, details = FAILED, _describe(exc)
                if isinstance(exc, dist.DistributedError):
                    broken = name  # later collectives would only wait on a broken group
        results.append({"name": name, "status": status,
                        "seconds": round(time.perf_counter() - start, 4), "details": details})
        write_json(out, {"rank": ctx.rank, "checks": results})
    try:
        dist.destroy_process_group()
    except Exception:  # the verdicts are written; a failed teardown is already among them
        pass
    return 0


def run_fault(ctx: Context, backend: str, pg_timeout: float) -> int:
    """The last rank SIGKILLs itself inside a loop of all-reduces; survivors time the error."""
    from neural_arch import distributed as dist
    victim = ctx.world_size - 1
    out = ctx.work_dir / f"fault_rank{ctx.rank}.json"
    dist.init_process_group(backend=backend, timeout=pg_timeout)
    # The launcher stops the other workers as soon as it sees the victim die; the survivors must
    # stay long enough to notice the death through their own transport.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    dist.barrier()
    outcome: dict = {"rank": ctx.rank, "error": None}
    buf = np.ones(4096)
    try:
        for i in range(FAULT_ITERATIONS):
            if ctx.rank == victim and i == FAULT_KILL_AT and not ctx.corrupt(FAULT_CHECK):
                write_json(ctx.work_dir / "fault_kill.json", {"rank": victim, "time": time.time()})
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(buf)
        outcome["iterations"] = FAULT_ITERATIONS
    except dist.DistributedError as exc:
        outcome.update(time=time.time(), error=type(exc).__name__, message=str(exc),
                       peer=exc.peer, is_distributed_error=True)
    except Exception as exc:
        outcome.update(time=time.time(), error=type(exc).__name__, message=str(exc),
                       peer=None, is_distributed_error=False)
    write_json(out, outcome)
    # Stay until every survivor has reported: a survivor that left early would look like a
    # second failure to the slower ones.
    deadline = time.monotonic() + FAULT_DETECTION_LIMIT_S + 2.0
    while time.monotonic() < deadline and not all(
            (ctx.work_dir / f"fault_rank{r}.json").exists() for r in range(victim)):
        time.sleep(0.02)
    # The group is broken on purpose: an orderly teardown could wait on the dead peer.
    os._exit(0)
