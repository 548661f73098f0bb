"""Shared pieces of the launcher tests (no tests here): worker scripts, running the CLI, pids.

Workers record ``pid starttime`` files under the job's ``out`` directory; the ``job`` fixture
kills every recorded process that is still alive at the end of a test, so a failing test
leaves nothing behind either.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LAUNCHER = [sys.executable, "-m", "neural_arch.distributed.launcher"]
CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
            "MASTER_ADDR", "MASTER_PORT", "NEURAL_ARCH_BACKEND", "RESTART_COUNT",
            "NEURAL_ARCH_SECRET", "PYTHONUNBUFFERED", "OMP_NUM_THREADS")

# Prepended to every worker script the tests write.
PRELUDE = '''\
import json, os, signal, subprocess, sys, time
from pathlib import Path

OUT = Path(os.environ["LAUNCHER_TEST_OUT"])
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["RESTART_COUNT"])


def start_time(pid):
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rsplit(")", 1)[1].split()[19]


def record_pid(pid=None, tag="worker"):
    pid = pid or os.getpid()
    path = OUT / f"pid_{tag}_{RANK}_{ATTEMPT}_{pid}"
    path.with_suffix(".tmp").write_text(f"{pid} {start_time(pid)}")
    path.with_suffix(".tmp").rename(path)


def dump_env(tag="env"):
    contract = {k: os.environ.get(k) for k in %(contract)r}
    contract["argv"] = sys.argv[1:]
    (OUT / f"{tag}_{RANK}_{ATTEMPT}.json").write_text(json.dumps(contract))


def wait_for_files(pattern, count, limit=30.0):
    deadline = time.monotonic() + limit
    while len(list(OUT.glob(pattern))) < count:
        if time.monotonic() > deadline:
            sys.exit(99)
        time.sleep(0.02)

''' % {"contract": CONTRACT}


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def process_alive(pid: int, start_time: Optional[str] = None) -> bool:
    """Running (not a zombie) and, when given, started at ``start_time`` (pids get reused)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return False
    if start_time is not None and fields[19] != start_time:
        return False
    return fields[0] not in ("Z", "X")


def wait_until(predicate, limit: float = 30.0) -> bool:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


class LauncherJob:
    """A scratch directory with worker scripts, launcher runs and their recorded pids."""

    def __init__(self, root: Path) -> None:
        self.dir = root
        self.out = root / "out"
        self.out.mkdir()
        self._launchers: List[subprocess.Popen] = []

    def env(self, **extra: str) -> Dict[str, str]:
        env = dict(os.environ)
        env.pop("NEURAL_ARCH_SECRET", None)
        env.pop("OMP_NUM_THREADS", None)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT),
                                                          env.get("PYTHONPATH")]))
        env["LAUNCHER_TEST_OUT"] = str(self.out)
        env.update(extra)
        return env

    def script(self, body: str, name: str = "worker.py") -> str:
        path = self.dir / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(PRELUDE + textwrap.dedent(body))
        return name

    def start(self, *args: object, env: Optional[Dict[str, str]] = None) -> subprocess.Popen:
        proc = subprocess.Popen(LAUNCHER + [str(a) for a in args], cwd=self.dir,
                                env=env or self.env(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, start_new_session=True)
        self._launchers.append(proc)
        return proc

    def finish(self, proc: subprocess.Popen, timeout: float = 60.0) -> Result:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.cleanup()
            out, err = proc.communicate(timeout=10)
            pytest.fail(f"launcher still running after {timeout}s\nstdout:\n{out}\n"
                        f"stderr:\n{err}")
        return Result(proc.returncode, out, err)

    def run(self, *args: object, timeout: float = 60.0,
            env: Optional[Dict[str, str]] = None) -> Result:
        return self.finish(self.start(*args, env=env), timeout)

    def recorded(self, tag: str = "worker") -> List[Tuple[int, str]]:
        """(pid, start time) of every process recorded under ``tag``."""
        found = []
        for path in sorted(self.out.glob(f"pid_{tag}_*")):
            if path.suffix != ".tmp":
                pid, start = path.read_text().split()
                found.append((int(pid), start))
        return found

    def live_recorded(self) -> List[int]:
        return [pid for pid, start in self.recorded("*") if process_alive(pid, start)]

    def envs(self, tag: str = "env") -> Dict[Tuple[int, int], dict]:
        """(rank, attempt) -> the contract a worker dumped."""
        result = {}
        for path in self.out.glob(f"{tag}_*.json"):
            _, rank, attempt = path.stem.rsplit("_", 2)
            result[(int(rank), int(attempt))] = json.loads(path.read_text())
        return result

    def cleanup(self) -> None:
        for proc in self._launchers:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)
        for pid, start in self.recorded("*"):
            if process_alive(pid, start):
                os.kill(pid, signal.SIGKILL)


@pytest.fixture
def job(tmp_path: Path):
    launcher_job = LauncherJob(tmp_path)
    yield launcher_job
    launcher_job.cleanup()
