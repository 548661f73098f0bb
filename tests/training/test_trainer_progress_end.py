"""How rank 0's console ends on a terminal: the progress bar's last state once, then the
``done:`` summary as the last line, with no redraw of the bar after it."""
import fcntl
import os
import pty
import select
import struct
import subprocess
import sys
import termios
import textwrap

import pytest

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(60)
pytest.importorskip("tqdm", reason="the bar is tqdm's")

SCRIPT = textwrap.dedent("""
    import numpy as np
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader, TensorDataset
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer, TrainingConfig
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    manual_seed(0)
    model = MLP([6, 8, 2])
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                      TrainingConfig(epochs=2, log_interval=2))
    trainer.fit(DataLoader(TensorDataset(x, y), batch_size=8))
""")


def run_on_a_terminal(tmp_path) -> str:
    """The script's stdout and stderr as a terminal 100 columns wide receives them."""
    script = tmp_path / "fit.py"
    script.write_text(SCRIPT)
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    for name in ("RANK", "WORLD_SIZE", "NEURAL_ARCH_CONSOLE_TTY"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, str(script)], stdout=follower, stderr=follower,
                            stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    seen = b""
    try:
        while True:
            ready, _, _ = select.select([leader], [], [], 30)
            if not ready:
                break
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: the script is gone
                break
            if not chunk:
                break
            seen += chunk
        proc.wait(timeout=30)
    finally:
        os.close(leader)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = seen.decode(errors="replace")
    assert proc.returncode == 0, text
    return text


def test_the_summary_is_the_last_line_and_the_bar_ends_once(tmp_path):
    text = run_on_a_terminal(tmp_path)
    assert text.count("done: 8 steps") == 1, text
    before, after = text.split("done: 8 steps")
    assert "8/8" in before  # the bar reached its end above the summary
    # nothing drawn after the summary line: no bar finishing again (and again) below it
    assert after.split("\n", 1)[1].strip() == "", repr(after)
