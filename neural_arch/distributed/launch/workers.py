"""Worker processes of the launcher: each in its own process group, output pumped by threads.

Every worker leads its own session so that stopping it also stops a stray grandchild, and gets
SIGTERM should the launcher die (``guard``). Its stdout and stderr are read line by line,
prefixed with the rank on the console and mirrored to ``rank_<R>.log``; a failed console write
never stops a reader, or the worker would block.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from typing import IO, Dict, List, Mapping, Optional, Sequence, Union

from .guard import die_with_launcher, live_groups

__all__ = ["WorkerOutput", "WorkerProcess", "describe_exit", "exit_code"]


def describe_exit(returncode: int) -> str:
    """``exit code 3`` or ``signal SIGKILL (exit code 137)`` for a Popen return code."""
    if returncode >= 0:
        return f"exit code {returncode}"
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return f"signal {name} (exit code {128 - returncode})"


def exit_code(returncode: int) -> int:
    """Shell convention: a death by signal N becomes 128+N."""
    return returncode if returncode >= 0 else 128 - returncode


def _segments(stream: IO[bytes]):
    """Pieces of output ending in a newline or a carriage return.

    Progress bars redraw their line with ``\\r``; passing those pieces on as they come keeps a
    worker's bar live on the console instead of arriving all at once at the next newline.
    """
    pending = b""
    while True:
        chunk = stream.read1(65536) if hasattr(stream, "read1") else stream.readline()
        if not chunk:
            break
        pending += chunk
        end = 0
        for match in _LINE_END.finditer(pending):
            end = match.end()
            yield pending[match.start():end]
        pending = pending[end:]
    if pending:
        yield pending


_LINE_END = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")


class WorkerOutput:
    """Serialises worker lines and launcher notes onto the console and the per-rank logs."""

    def __init__(self, prefix: bool, log_dir: Optional[Union[str, os.PathLike]],
                 ranks: Sequence[int]) -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self.log_paths: Dict[int, str] = {}
        self._logs: Dict[int, IO[str]] = {}
        if log_dir is not None:
            os.makedirs(log_dir, exist_ok=True)
            for rank in ranks:
                self.log_paths[rank] = os.path.join(log_dir, f"rank_{rank}.log")
                self._logs[rank] = open(self.log_paths[rank], "w", encoding="utf-8")

    def worker_line(self, rank: int, data: bytes, is_err: bool) -> None:
        text = data.decode("utf-8", errors="replace")
        if not text.endswith(("\n", "\r")):
            text += "\n"
        with self._lock:
            # A failed console write must not stop the reader, or the worker would block on
            # a full pipe; the log file still gets the line.
            self._write(sys.stderr if is_err else sys.stdout,
                        f"[rank {rank}] {text}" if self._prefix else text)
            if rank in self._logs:
                self._write(self._logs[rank], text)

    def note(self, message: str, *, to_logs: bool = False) -> None:
        with self._lock:
            self._write(sys.stderr, f"launcher: {message}\n")
            if to_logs:
                for log in self._logs.values():
                    self._write(log, f"launcher: {message}\n")

    @staticmethod
    def _write(stream: IO[str], text: str) -> None:
        try:
            stream.write(text)
            stream.flush()
        except (OSError, ValueError):
            pass

    def close(self) -> None:
        with self._lock:
            for log in self._logs.values():
                log.close()
            self._logs.clear()


class WorkerProcess:
    """One worker process, the leader of its own process group, with two output readers."""

    def __init__(self, rank: int, argv: List[str], env: Mapping[str, str],
                 payload: Optional[bytes], output: "WorkerOutput") -> None:
        self.rank = rank
        self.proc = subprocess.Popen(
            argv, env=dict(env), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL if payload is None else subprocess.PIPE,
            start_new_session=True, preexec_fn=die_with_launcher())
        self._group_gone = False
        self._threads = [threading.Thread(target=self._pump, args=(stream, is_err, output),
                                          name=f"launcher-rank{rank}-{name}", daemon=True)
                         for stream, is_err, name in ((self.proc.stdout, False, "out"),
                                                      (self.proc.stderr, True, "err"))]
        if payload is not None:
            # A thread, so a worker that never reads cannot block the launcher.
            self._threads.append(threading.Thread(target=self._feed, args=(payload,),
                                                  name=f"launcher-rank{rank}-in", daemon=True))
        for thread in self._threads:
            thread.start()

    def _pump(self, stream: IO[bytes], is_err: bool, output: "WorkerOutput") -> None:
        with stream:
            for line in _segments(stream):
                output.worker_line(self.rank, line, is_err)

    def _feed(self, payload: bytes) -> None:
        try:
            with self.proc.stdin:
                self.proc.stdin.write(payload)
        except (BrokenPipeError, ValueError, OSError):
            pass  # the worker died first; its exit code tells the story

    def alive(self) -> bool:
        """True while the worker or anything left in its process group still runs."""
        if self.proc.poll() is None:
            return True
        if not self._group_gone and not live_groups([self.proc.pid]):
            self._group_gone = True  # once empty, the id may be reused: never signal it again
        return not self._group_gone

    def signal_group(self, signum: int) -> None:
        if self.alive():
            try:
                os.killpg(self.proc.pid, signum)
            except (ProcessLookupError, PermissionError):
                pass

    def finish(self, give_up: float) -> None:
        """Reap the worker and drain its output, waiting no later than ``give_up``."""
        try:
            self.proc.wait(timeout=max(0.0, give_up - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
        for thread in self._threads:
            thread.join(timeout=max(0.0, give_up - time.monotonic()))
