"""``neural_arch.save`` killed mid-write: its temporary file is removed by the next save of that
name, while the temporary of a writer that still runs is kept and its save completes.

The writer here is a real process that stops halfway through writing its temporary file (a
stand-in ``open`` waits for a line on stdin), so the kill always lands mid-write.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import neural_arch as na
from neural_arch.distributed.checkpoint import owner

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(90)
LOGGER = "neural_arch.serialization"
WAIT_S = 60  # a wait that should end at once; only a broken writer reaches it
VALUES = 2 ** 20  # 8 MB of float64: the writer stops after 4 MB of its temporary file

STOPPING_WRITER = """
import builtins, sys
import numpy as np
import neural_arch as na

real_open = builtins.open

class StopHalfway:
    def __init__(self, file):
        self.file, self.stopped = file, False
    def __enter__(self):
        return self
    def __exit__(self, *exc):
        self.file.close()
    def write(self, data):
        data = memoryview(data).cast("B")
        if self.stopped or len(data) < 2 ** 20:
            return self.file.write(data)
        self.stopped, half = True, len(data) // 2
        self.file.write(data[:half])
        self.file.flush()
        print(self.file.name, flush=True)
        sys.stdin.readline()
        return half + self.file.write(data[half:])

def stopping_open(file, mode="r", *args, **kwargs):
    opened = real_open(file, mode, *args, **kwargs)
    return StopHalfway(opened) if "w" in mode and str(file).endswith(".tmp") else opened

builtins.open = stopping_open
na.save({"w": np.full(int(sys.argv[3]), float(sys.argv[2]))}, sys.argv[1])
"""


def _stopped_writer(path, value: float):
    """A process saving ``value`` to ``path``, stopped halfway through its temporary file."""
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(STOPPING_WRITER), str(path),
                             str(value), str(VALUES)],
                            env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)), text=True,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    temporary = proc.stdout.readline().strip()
    if not temporary:
        _stop(proc)
        pytest.fail(f"the writer did not start writing: {proc.stderr.read()}")
    assert os.path.getsize(temporary) >= VALUES * 4  # half written
    return proc, temporary


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
    proc.communicate(timeout=WAIT_S)


def test_a_killed_writers_temporary_is_removed_by_the_next_save(tmp_path, caplog):
    path = tmp_path / "snapshot.nf"
    writer, temporary = _stopped_writer(path, 1.0)
    try:
        writer.send_signal(signal.SIGKILL)
        writer.wait(timeout=WAIT_S)
    finally:
        _stop(writer)
    assert os.path.exists(temporary) and not path.exists()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        na.save({"w": np.full(4, 2.0)}, path)
    assert os.listdir(tmp_path) == ["snapshot.nf"]
    assert na.load(path)["w"].tolist() == [2.0] * 4
    assert any(os.path.basename(temporary) in r.getMessage() for r in caplog.records)


def test_a_live_writers_temporary_is_kept_and_its_save_completes(tmp_path):
    path = tmp_path / "snapshot.nf"
    writer, temporary = _stopped_writer(path, 1.0)
    try:
        na.save({"w": np.full(4, 2.0)}, path)  # another writer of the same name meanwhile
        assert os.path.exists(temporary)
        _, stderr = writer.communicate("go\n", timeout=WAIT_S)
    finally:
        _stop(writer)
    assert writer.returncode == 0, stderr
    assert os.listdir(tmp_path) == ["snapshot.nf"]
    out = na.load(path)["w"]
    assert out.shape == (VALUES,) and (out == 1.0).all()  # the last rename won, whole


def _gone_pid() -> int:
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, timeout=WAIT_S, check=True)
    pid = int(proc.stdout)
    assert owner.state(dataclasses.replace(owner.this_process(), pid=pid, start=0)) == owner.GONE
    return pid


def test_temporaries_are_judged_by_their_recorded_writer(tmp_path, caplog):
    """Removed: a gone writer's, recorded or (as older saves wrote them) by pid alone, and one
    whose pid now belongs to a later process. Kept: a running writer's, one from another host
    (it cannot be checked from here), and the temporaries of other names."""
    me, gone = owner.this_process(), _gone_pid()
    writers = {"reused pid": dataclasses.replace(me, start=me.start + 1),
               "gone": dataclasses.replace(me, pid=gone),
               "running": me, "other host": dataclasses.replace(me, host="0123456789abcdef")}
    names = {what: f"snapshot.nf.{writer}-0abc1234.tmp" for what, writer in writers.items()}
    names.update({"pid gone": f"snapshot.nf.{gone}.tmp", "pid running": f"snapshot.nf.{me.pid}.tmp",
                  "other name": f"other.nf.{gone}.tmp", "longer name": f"snapshot.nf.x.{gone}.tmp",
                  "not ours": "snapshot.nf.backup.tmp"})
    for name in names.values():
        (tmp_path / name).write_bytes(b"half a file")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        na.save({"step": 3}, tmp_path / "snapshot.nf")
    removed = {"reused pid", "gone", "pid gone"}
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["snapshot.nf"] + [name for what, name in names.items() if what not in removed])
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert all(names[what] in warned for what in removed), warned
    assert na.load(tmp_path / "snapshot.nf") == {"step": 3}
