"""The distributed examples, started the way the README starts them: through the launcher."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.timeout(300)


def launch(script, *args, nproc=2):
    cmd = [sys.executable, "-m", "neural_arch.distributed.launcher", "--standalone",
           os.path.join(ROOT, "examples", script), f"--nproc_per_node={nproc}", *args]
    result = subprocess.run(cmd, capture_output=True, timeout=280, cwd=ROOT)
    # Decoded by hand: text mode would turn a progress bar's carriage returns into newlines.
    result.stdout, result.stderr = (b.decode("utf-8", errors="replace")
                                    for b in (result.stdout, result.stderr))
    return result


@pytest.mark.parametrize("backend,nproc,extra", [("shm", 2, []), ("tcp", 3, ["--explicit-sync"])])
def test_train_distributed_reaches_95_percent_with_identical_replicas(backend, nproc, extra):
    result = launch("train_distributed.py", f"--backend={backend}", *(["--"] + extra if extra else []),
                    nproc=nproc)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    match = re.search(r"\[rank 0\] final: test_accuracy=([0-9.]+) world_size=(\d+) backend=(\w+) "
                      r"replicas_agree=(\w+)", result.stdout)
    assert match, result.stdout[-3000:]
    accuracy, world, used_backend, agree = match.groups()
    assert float(accuracy) >= 0.95
    assert int(world) == nproc and used_backend == backend and agree == "True"
    # The output is a pipe here, not a terminal: plain lines, one per epoch, no redrawn bar.
    output = result.stdout + result.stderr
    assert "\r" not in output and "[rank 0] [rank 0]" not in output, output[-3000:]
    epochs = re.findall(r"^\[rank 0\] epoch +(\d+)  loss ", result.stdout, re.MULTILINE)
    assert epochs == [str(e) for e in range(1, 16)], result.stdout[-3000:]


def test_quickstart_runs_as_printed_and_learns():
    result = launch("quickstart.py")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    losses = [float(x) for x in re.findall(r"= ([0-9.]+)$", result.stdout, re.MULTILINE)]
    assert len(losses) == 5, result.stdout
    assert losses[-1] < 0.75 * losses[0], losses


def run_on_a_terminal(cmd, env):
    """Run ``cmd`` with stdout and stderr on a pseudo-terminal of 100 columns; its output."""
    import fcntl
    import pty
    import struct
    import termios
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen(cmd, stdout=slave, stderr=slave, env=env, cwd=ROOT)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:  # the terminal closes when the child exits
            break
        if not chunk:
            break
        out += chunk
    os.close(master)
    assert proc.wait(timeout=120) == 0, out[-3000:]
    return out.decode("utf-8", errors="replace")


def test_train_distributed_shows_one_bar_for_the_whole_run_on_a_terminal():
    env = {k: v for k, v in os.environ.items()
           if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    out = run_on_a_terminal([sys.executable, os.path.join(ROOT, "examples", "train_distributed.py"),
                             "--epochs", "3"], env)
    assert "epoch" not in "".join(re.findall(r"\r([^\r\n|]*)\|", out)), "one bar, not one per epoch"
    assert re.search(r"training: 100%\|[^\r\n]*\| 135/135 ", out), out[-2000:]
    assert re.findall(r"^epoch +(\d+)  loss", out.replace("\r", "\n"), re.MULTILINE) == \
        ["1", "2", "3"]
