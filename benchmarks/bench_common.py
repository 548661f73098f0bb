"""What the distributed benchmarks share: jobs of real processes, timing, sizes and models.

A benchmark script runs twice over: once as the driver (parses options, starts jobs, prints
and writes the results) and, inside each job, as ``SCRIPT --worker JOB_DIR`` on every rank.
Jobs on the ``shm`` and ``tcp`` backends start through our launcher, ``mpi`` jobs through
``mpiexec``. Rank 0 writes the job's result as JSON into the job directory.

The reporting helpers live in ``bench_reporting``; they are re-exported here.
"""
from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

# Re-exported: the scripts and tests call these as common.<name>.
from bench_reporting import (command_line, cpu_model, machine_info,  # noqa: F401
                             markdown_table, open_mpi_version, publish, pyplot, save_figure,
                             section_head, verdict, write_section)

THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
               "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
_RANK_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
              "MASTER_PORT", "GROUP_RANK", "NODE_RANK")
_MPI_STOP_GRACE_S = 5.0
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
               "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}


BACKENDS = ("shm", "tcp", "mpi")


class JobFailed(RuntimeError):
    """A benchmark job exited with an error or ran past its time limit."""


def one_thread_per_rank() -> None:
    """One BLAS/OpenMP thread per process; must run before NumPy is imported."""
    for name in THREAD_VARS:
        os.environ[name] = "1"


# ----- sizes -----------------------------------------------------------------------------------
def parse_size(text: str) -> int:
    """``"4"``, ``"1K"``, ``"16MiB"``, ``"0.5M"`` -> bytes (binary units)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).upper() if match else None
    if match is None or unit not in _SIZE_UNITS:
        raise ValueError(f"cannot read size {text!r}; write e.g. 4, 64K, 16M or 256MiB")
    value = int(float(match.group(1)) * _SIZE_UNITS[unit])
    if value < 1:
        raise ValueError(f"size {text!r} is below one byte")
    return value


def parse_size_list(text: str) -> List[int]:
    return sorted({parse_size(part) for part in text.split(",") if part.strip()})


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale and nbytes % scale == 0:
            return f"{nbytes // scale} {unit}"
    return f"{nbytes} B"


# ----- timing ----------------------------------------------------------------------------------
def time_batches(call: Callable[[], Any], barrier: Callable[[], Any], calls_per_batch: int,
                 batches: int, warmup_batches: int = 1) -> List[float]:
    """Seconds per call of each timed batch; every batch starts right after a barrier."""
    per_call = []
    for i in range(warmup_batches + batches):
        barrier()
        start = time.perf_counter()
        for _ in range(calls_per_batch):
            call()
        elapsed = time.perf_counter() - start
        if i >= warmup_batches:
            per_call.append(elapsed / calls_per_batch)
    return per_call


def mpi_batch_seconds(comm, call: Callable[[], Any], nbytes: int, most_calls: int) -> float:
    """Seconds per call of one batch of ``call`` started right after a barrier of ``comm`` (an
    mpi4py communicator), as its slowest rank timed it: enough calls of ``nbytes`` each to move
    about 32 MiB, one at least and ``most_calls`` at most."""
    calls = max(1, min(most_calls, (32 << 20) // max(nbytes, 1)))
    (per_call,) = time_batches(call, comm.Barrier, calls, batches=1, warmup_batches=0)
    return max(comm.allgather(per_call))


def mpi_medians_in_turns(comm, calls: Dict[str, Callable[[], Any]], nbytes: int, rounds: int,
                         most_calls: int) -> Dict[str, float]:
    """Median seconds per call of each of ``calls`` (``mpi_batch_seconds``), timed in turns so
    that machine noise hits them alike: one untimed batch each, then ``rounds`` rounds of one
    batch each, each round's order shuffled (the same on every rank). A fixed order, even
    rotated, keeps each call right after the same other one, and what a call leaves can cost
    the next: at 16 MiB on two ranks the row timed right after MPI_Allreduce read slower, which
    showed as a gap between ``mpi_layers.py``'s public call and its algorithm
    (``benchmarks/RESULTS.md``)."""
    for call in calls.values():
        mpi_batch_seconds(comm, call, nbytes, most_calls)
    names, times = list(calls), {name: [] for name in calls}
    for turn in range(rounds):
        order = names[:]
        random.Random(turn).shuffle(order)  # seeded by the round: every rank agrees
        for name in order:
            times[name].append(mpi_batch_seconds(comm, calls[name], nbytes, most_calls))
    return {name: median(found) for name, found in times.items()}


def interleaved_step_ms(runners: Dict[str, Callable[[], Any]], steps: int,
                        warmup: int) -> Dict[str, float]:
    """Median ms per call of each runner, stepped in turn; the first ``warmup`` rounds are not
    timed. The order rotates, so that each goes first as often, machine noise hits them alike,
    and none always runs right after the same other one (whose memory traffic would otherwise
    always be cleaned up by the same runner)."""
    names, times = list(runners), {name: [] for name in runners}
    for i in range(warmup + steps):
        turn = i % len(names)
        for name in names[turn:] + names[:turn]:
            start = time.perf_counter()
            runners[name]()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return {name: median(t) * 1e3 for name, t in times.items()}


def median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else 0.5 * (ordered[mid - 1] + ordered[mid])


def slowest_median(per_rank: Sequence[Sequence[float]]) -> float:
    """Max over ranks of each rank's median: a collective is as fast as its slowest rank."""
    return max(median(times) for times in per_rank)


# ----- jobs ------------------------------------------------------------------------------------
def mpi_available() -> bool:
    try:
        import importlib.util
        return importlib.util.find_spec("mpi4py") is not None and bool(shutil.which("mpiexec"))
    except (ImportError, ValueError):
        return False


def installed_backends() -> List[str]:
    """The backends that can run here, in the order the reports list them."""
    from neural_arch.distributed.transports import available_transports
    names = [b for b in ("shm", "tcp") if b in available_transports()]
    if "mpi" in available_transports() and mpi_available():
        names.append("mpi")
    return names


def parse_backends(text: str) -> List[str]:
    names = [b.strip() for b in text.split(",") if b.strip()]
    if not names or any(b not in BACKENDS for b in names):
        raise ValueError(f"--backends must name some of {', '.join(BACKENDS)}; got {names}")
    return names


def run_job(script: str, backend: str, world_size: int, job: Dict[str, Any],
            timeout: float) -> Dict[str, Any]:
    """Run ``script --worker DIR`` on ``world_size`` ranks; return rank 0's result."""
    job_dir = tempfile.mkdtemp(prefix="nf_bench_")
    try:
        with open(os.path.join(job_dir, "job.json"), "w", encoding="utf-8") as handle:
            json.dump(dict(job, backend=backend, world_size=world_size), handle)
        if backend == "mpi":
            code = _run_mpiexec(script, world_size, job_dir, timeout)
        else:
            from neural_arch.distributed import launch_distributed_training
            from neural_arch.distributed.launcher import LaunchError
            env = {name: "1" for name in THREAD_VARS}
            try:
                code = launch_distributed_training(
                    script, nproc_per_node=world_size, backend=backend, standalone=True,
                    script_args=["--worker", job_dir], timeout=timeout, env=env)
            except LaunchError as exc:
                raise JobFailed(f"could not launch the {backend!r} job: {exc}") from exc
        result_path = os.path.join(job_dir, "result.json")
        if code != 0 or not os.path.exists(result_path):
            why = "ran past its time limit" if code == 124 else f"exited with code {code}"
            raise JobFailed(f"{os.path.basename(script)} job on backend {backend!r} with "
                            f"{world_size} ranks {why} (time limit {timeout:.0f} s)")
        with open(result_path, encoding="utf-8") as handle:
            return json.load(handle)
    finally:
        _kill_recorded_ranks(job_dir)
        shutil.rmtree(job_dir, ignore_errors=True)


def run_jobs(script: str, plan: Sequence[Tuple[str, str, int]], job: Dict[str, Any],
             timeout: float) -> Tuple[List[Dict[str, Any]], List[str]]:
    """Run one job per ``(title, backend, world_size)`` of ``plan``, in order, printing each
    title; return rank 0's results of the jobs that finished and a message for each failure."""
    results, failures = [], []
    for title, backend, world_size in plan:
        print(f"== {title}", flush=True)
        try:
            results.append(run_job(script, backend, world_size, job, timeout))
        except JobFailed as exc:
            failures.append(str(exc))
            print(f"FAILED: {exc}", flush=True)
    return results, failures


def _run_mpiexec(script: str, world_size: int, job_dir: str, timeout: float) -> int:
    env = {k: v for k, v in os.environ.items() if k not in _RANK_VARS}
    env.update(_MPI_ENV, PYTHONUNBUFFERED="1", **{name: "1" for name in THREAD_VARS})
    # Unbound, like the launcher's workers: on a shared machine a rank pinned to a busy core
    # could not move to an idle one.
    cmd = ["mpiexec", "-n", str(world_size), "--oversubscribe", "--bind-to", "none",
           sys.executable, "-u", script, "--worker", job_dir]
    proc = subprocess.Popen(cmd, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        return 124
    finally:
        if proc.poll() is None:
            # SIGTERM first: mpiexec then stops its ranks and removes its shared memory.
            proc.terminate()
            try:
                proc.wait(timeout=_MPI_STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _kill_recorded_ranks(job_dir: str) -> None:
    """Ranks of a stopped job that are still alive (mpiexec may start them in own sessions)."""
    for name in os.listdir(job_dir):
        if not name.startswith("pid."):
            continue
        try:
            with open(os.path.join(job_dir, name), encoding="utf-8") as handle:
                os.kill(int(handle.read()), signal.SIGKILL)
        except (OSError, ValueError):
            pass


def entry_point(argv: Optional[Sequence[str]], script_relpath: str,
                parse_args: Callable[[Optional[Sequence[str]]], Any],
                worker: Callable[[Dict[str, Any]], Any],
                drive: Callable[[Any, str, str], int]) -> int:
    """A benchmark script's ``main``. Started as a rank of a job (``--worker DIR``) it runs
    ``worker``; as the driver it returns ``drive(args, command, machine)``, where ``command``
    reproduces this run and ``machine`` describes the machine as the run starts."""
    args = parse_args(argv)
    if args.worker:
        worker_main(args.worker, worker)
        return 0
    machine = machine_info()
    command = command_line(script_relpath, sys.argv[1:] if argv is None else argv)
    return drive(args, command, machine)


def worker_main(job_dir: str, body: Callable[[Dict[str, Any]], Any]) -> None:
    """One rank of a job: join the group, run ``body(job)``, rank 0 saves what it returns."""
    from neural_arch import distributed as dist
    with open(os.path.join(job_dir, "job.json"), encoding="utf-8") as handle:
        job = json.load(handle)
    dist.init_process_group(backend=job["backend"], timeout=job.get("collective_timeout", 300))
    rank = dist.get_rank()
    pid_path = os.path.join(job_dir, f"pid.{rank}")
    with open(pid_path, "w", encoding="utf-8") as handle:
        handle.write(str(os.getpid()))
    try:
        result = body(job)
        if rank == 0:
            path = os.path.join(job_dir, "result.json")
            with open(path + ".tmp", "w", encoding="utf-8") as handle:
                json.dump(result, handle)
            os.replace(path + ".tmp", path)
    finally:
        dist.destroy_process_group()
        os.remove(pid_path)  # a clean exit: nothing left for the driver to kill


def parameter_count(sizes: Sequence[int]) -> int:
    """Weights and biases of an MLP with these layer widths."""
    return sum(a * b + b for a, b in zip(sizes[:-1], sizes[1:]))


def model_name(sizes: Sequence[int]) -> str:
    return "-".join(str(n) for n in sizes)
