"""Rank 0's progress bar: drawn when its output reaches a terminal, directly or through the
launcher (whose workers write to pipes), and not when the output goes to a file."""
from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import textwrap

import pytest

from neural_arch.distributed.launch.config import CONSOLE_TTY_VAR
from neural_arch.training import progress

pytestmark = pytest.mark.timeout(120)
pytest.importorskip("tqdm", reason="the bar is tqdm's")

WORKER = textwrap.dedent("""
    import os, sys, time
    from neural_arch.training.progress import Progress
    bar = Progress(total=3, done=0, enabled=os.environ["RANK"] == "0", verbose=False)
    for _ in range(3):
        bar.advance(1.0)
        time.sleep(0.05)
    print("tty", os.environ.get("NEURAL_ARCH_CONSOLE_TTY"), "bar", bar._bar is not None,
          flush=True)
""")


def _launch(tmp_path, stderr_terminal: bool):
    """Run a 2-rank job whose rank 0 makes a Progress; return (stdout, stderr) as text."""
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    argv = [sys.executable, "-m", "neural_arch.distributed.launcher", "--nproc_per_node=2",
            "--backend=shm", str(script)]
    env = {k: v for k, v in os.environ.items() if k != CONSOLE_TTY_VAR}
    if not stderr_terminal:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr
        return done.stdout, done.stderr
    leader, follower = pty.openpty()
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=follower,
                            stdin=subprocess.DEVNULL)
    os.close(follower)
    seen = b""
    try:
        while True:  # drain the terminal, or the launcher blocks writing to it
            ready, _, _ = select.select([leader], [], [], 60)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: every writer is gone
                break
            if not chunk:
                break
            seen += chunk
        out = proc.communicate(timeout=60)[0]
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, seen.decode(errors="replace")
    return out.decode(), seen.decode(errors="replace")


def test_a_bar_through_the_launcher_when_its_console_is_a_terminal(tmp_path):
    out, terminal = _launch(tmp_path, stderr_terminal=True)
    assert "tty 1 bar True" in out  # rank 0
    assert "tty 1 bar False" in out  # rank 1 never draws one
    assert "3/3" in terminal and "\r" in terminal  # tqdm redrew its line on the terminal


def test_no_bar_when_the_launcher_writes_to_a_file_or_pipe(tmp_path):
    out, err = _launch(tmp_path, stderr_terminal=False)
    assert out.count("tty None bar False") == 2, out
    assert "3/3" not in err


def test_console_is_terminal_reads_the_launchers_flag(monkeypatch):
    monkeypatch.setattr(sys, "stderr", open(os.devnull, "w"))
    monkeypatch.delenv(CONSOLE_TTY_VAR, raising=False)
    assert progress.console_is_terminal() is False
    monkeypatch.setenv(CONSOLE_TTY_VAR, "1")
    assert progress.console_is_terminal() is True
    monkeypatch.setenv(CONSOLE_TTY_VAR, "0")
    assert progress.console_is_terminal() is False
