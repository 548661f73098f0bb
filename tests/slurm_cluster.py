"""A one-node SLURM cluster of our own for the tests: munged, slurmctld and slurmd started as
root in the foreground (so their pids are ours to stop), every file they write in one temporary
folder, none of the host's configuration read or changed.

``SlurmCluster.start(folder)`` writes the key, ``slurm.conf`` and the daemons' folders, starts
the daemons and waits until ``sinfo`` shows the node idle; ``submit`` runs an sbatch script to
its end; ``stop`` cancels what is left, then stops the daemons by pid. ``missing()`` says why
this host cannot run one (None when it can), for the tests' skip reason.

Authentication is munge's when munged is installed: a fresh key, and the daemon on its own
socket, so it never meets the host's munged. Without munged, ``auth/none`` (which Slurm 22.05
still ships) lets the daemons and clients trust each other with no credentials at all, which is
fine for a cluster that lives in a temporary folder for one test session.
"""
from __future__ import annotations

import ctypes
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Mapping, Optional

# Debian puts the daemons in /usr/sbin, which is not on a plain user's PATH.
_SEARCH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
DAEMONS = ("slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "sinfo", "squeue", "scancel", "scontrol")
INSTALL_HINT = "apt-get install slurmctld slurmd slurm-client munge"
START_TIMEOUT_S = 60.0
_LAUNCHER_PREFIXES = ("SLURM_", "OMPI_COMM_WORLD_", "PMI_", "PMIX_", "PET_", "HOROVOD_")
_LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                       "MASTER_ADDR", "MASTER_PORT", "JOB_COMPLETION_INDEX",
                       "NEURAL_ARCH_BACKEND", "NEURAL_FORGE_BACKEND", "NEURAL_ARCH_RUN_ID")
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
          "BOOT_FAIL", "DEADLINE", "PREEMPTED")


def which(name: str) -> Optional[str]:
    return shutil.which(name, path=_SEARCH)


def missing() -> Optional[str]:
    """Why a cluster cannot start here, or None."""
    absent = [n for n in DAEMONS + CLIENTS if which(n) is None]
    if absent:
        return f"SLURM is not installed ({', '.join(absent)} not found; {INSTALL_HINT})"
    if os.geteuid() != 0:
        return "starting slurmd needs root (it runs each job's tasks as their user)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class SlurmCluster:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.host = socket.gethostname().split(".")[0]
        self.conf = folder / "slurm.conf"
        self.auth = "munge" if which("munged") else "none"
        self._daemons: list[tuple[str, subprocess.Popen]] = []
        self._jobs: list[str] = []

    @property
    def env(self) -> dict[str, str]:
        """The environment of a client of this cluster (and of the jobs it runs): this
        process's, less what a launcher of the test session set (itself perhaps a SLURM job,
        whose SLURM_JOB_ID would send srun to that job), so every job here starts clean."""
        env = {k: v for k, v in os.environ.items()
               if not (k.startswith(_LAUNCHER_PREFIXES) or k in _LAUNCHER_VARIABLES)}
        return {**env, "SLURM_CONF": str(self.conf), "PATH": _SEARCH}

    @classmethod
    def start(cls, folder: Path) -> "SlurmCluster":
        cluster = cls(folder)
        try:
            cluster._write_config()
            cluster._start_daemons()
            cluster._wait_idle()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _write_config(self) -> None:
        # munged checks that its key is private and that everyone can reach its socket.
        self.folder.chmod(0o755)
        for name in ("state", "spool", "log", "munge", "socket"):
            (self.folder / name).mkdir(mode=0o700 if name == "munge" else 0o755)
        auth = [f"AuthType=auth/{self.auth}", f"CredType=cred/{self.auth}"]
        if self.auth == "munge":
            key = self.folder / "munge" / "munge.key"
            key.write_bytes(os.urandom(1024))
            key.chmod(0o400)
            auth.append(f"AuthInfo=socket={self.folder / 'socket' / 'munge.socket'}")
        f = self.folder
        lines = [
            # by address: the daemons and clients reach each other however the host name resolves
            "ClusterName=neuralforge", f"SlurmctldHost={self.host}(127.0.0.1)",
            # ports of our own: the host may run a SLURM, or another test session, already
            f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
            *auth, "SlurmUser=root", "SlurmdUser=root",
            f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={f / 'spool'}",
            f"SlurmctldPidFile={f / 'slurmctld.pid'}", f"SlurmdPidFile={f / 'slurmd.pid'}",
            f"SlurmctldLogFile={f / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={f / 'log' / 'slurmd.log'}",
            # no cgroups: the tests may run in a container that lets no one create them
            "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
            "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "MpiDefault=none",
            "JobAcctGatherType=jobacct_gather/none",
            "AccountingStorageType=accounting_storage/none", "ReturnToService=2",
            # job ids decide the port srun jobs meet at: not the same ones every session
            f"FirstJobId={random.randrange(1000, 900000)}",
            f"NodeName={self.host} NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN",
            f"PartitionName=debug Nodes={self.host} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, *args: str) -> None:
        log = open(self.folder / "log" / f"{name}.out", "wb")
        with log:
            proc = subprocess.Popen([which(name), *args], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env=self.env, cwd=self.folder,
                                    preexec_fn=_end_with_parent)
        self._daemons.append((name, proc))

    def _start_daemons(self) -> None:
        if self.auth == "munge":
            m = self.folder / "munge"
            self._spawn("munged", "--foreground", f"--key-file={m / 'munge.key'}",
                        f"--socket={self.folder / 'socket' / 'munge.socket'}",
                        f"--log-file={m / 'munged.log'}", f"--pid-file={m / 'munged.pid'}",
                        f"--seed-file={m / 'munged.seed'}")
            self._wait_for(lambda: (self.folder / "socket" / "munge.socket").exists(),
                           "munged's socket")
        # -D: foreground, so stop() holds each daemon's pid
        self._spawn("slurmctld", "-D", "-f", str(self.conf))
        self._spawn("slurmd", "-D", "-f", str(self.conf))

    def _wait_for(self, ready, what: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            dead = [(n, p.returncode) for n, p in self._daemons if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                raise RuntimeError(f"waiting for {what}: "
                                   + (f"{dead[0][0]} exited with {dead[0][1]}" if dead
                                      else f"not ready after {START_TIMEOUT_S:.0f} s")
                                   + "\n" + self.logs())
            time.sleep(0.2)

    def _wait_idle(self) -> None:
        def idle() -> bool:
            out = self.run("sinfo", "-h", "-N", "-o", "%t", check=False)
            return out.returncode == 0 and out.stdout.split() == ["idle"]
        self._wait_for(idle, f"node {self.host} to be idle in sinfo")

    def run(self, *cmd: str, check: bool = True, timeout: float = 30.0,
            env: Optional[Mapping[str, str]] = None,
            cwd: Optional[Path] = None) -> subprocess.CompletedProcess:
        """A SLURM client command against this cluster."""
        return subprocess.run([which(cmd[0]) or cmd[0], *cmd[1:]], capture_output=True,
                              text=True, check=check, timeout=timeout, cwd=cwd,
                              env={**self.env, **(env or {})})

    def submit(self, script: Path, output: Path, *options: str, timeout: float = 180.0,
               env: Optional[Mapping[str, str]] = None, cwd: Optional[Path] = None) -> str:
        """Run ``script`` with sbatch until it ends; returns its output file's text. A job that
        fails or outlives ``timeout`` raises with that text and the daemons' logs."""
        submitted = self.run("sbatch", "--parsable", f"--output={output}", *options,
                             str(script), env=env, cwd=cwd)
        job = submitted.stdout.strip().split(";")[0]
        self._jobs.append(job)
        # Polled here, not with sbatch --wait: that polls every 10 s or so, most of a short job.
        deadline = time.monotonic() + timeout
        while True:
            state = self.job_state(job)
            if state.get("JobState") in _ENDED:
                break
            if time.monotonic() > deadline:
                queue = self.run("squeue", check=False).stdout  # a pending job says why
                self.cancel()
                raise AssertionError(f"job {job} ({script.name}) still ran after "
                                     f"{timeout:.0f} s\n{queue}" + _text(output) + self.logs())
            time.sleep(0.25)
        text = _text(output)
        if state["JobState"] != "COMPLETED":
            raise AssertionError(f"job {job} ({script.name}) ended {state['JobState']} "
                                 f"(exit code {state.get('ExitCode')}):\n" + text + self.logs())
        return text

    def job_state(self, job: str) -> dict[str, str]:
        """``scontrol show job`` as a dict (slurmctld keeps ended jobs for MinJobAge, 300 s)."""
        out = self.run("scontrol", "-o", "show", "job", job, check=False).stdout
        return dict(f.split("=", 1) for f in out.split() if "=" in f)

    def pmix_missing(self) -> Optional[str]:
        """Why ``srun --mpi=pmix`` cannot start ranks here, or None."""
        tried = self.run("srun", "-n1", "--mpi=pmix", "true", check=False, timeout=60)
        if tried.returncode == 0:
            return None
        reason = " ".join(tried.stderr.split())
        if "can not load PMIx library" in tried.stderr:
            # Debian's plugin opens <libdir>/pmix2/lib/libpmix.so, a link only the -dev has
            reason += " (Debian: apt-get install libpmix-dev)"
        return f"srun --mpi=pmix fails: {reason}"

    def cancel(self) -> None:
        """Cancel the jobs this cluster ran and wait until none is left."""
        jobs = [j for j in self._jobs if j]
        if jobs:
            self.run("scancel", *jobs, check=False)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            queue = self.run("squeue", "-h", "-o", "%i", check=False)
            if queue.returncode != 0 or not queue.stdout.strip():
                return
            time.sleep(0.5)

    def stop(self) -> None:
        """Stop the daemons by pid, slurmd first (it ends the job steps it still runs)."""
        if any(n == "slurmctld" and p.poll() is None for n, p in self._daemons):
            self.cancel()
        for name, proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        self._daemons.clear()

    def logs(self) -> str:
        parts = []
        for path in sorted((self.folder / "log").glob("*")) + [self.folder / "munge" /
                                                                  "munged.log"]:
            if path.exists():
                tail = path.read_text(errors="replace").splitlines()[-15:]
                parts.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(parts)


def _end_with_parent() -> None:
    """In the daemon, before exec: be sent SIGTERM when the test process dies, so that a test
    session killed before its teardown leaves no daemon behind."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else f"({path.name} not written)\n"
