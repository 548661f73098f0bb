"""Files written whole (a temporary file renamed over the path) never replace a device or a
pipe: given ``/dev/null`` or a FIFO, ``save``, the profiler's trace, the TabGPT monitor's
statistics and a benchmark's report write into it, and the path stays what it was. (Renaming a
regular file over ``/dev/null`` as root takes it away from every program on the machine.) The
tests use a FIFO in a temporary folder, which a wrong rename would replace just the same."""
from __future__ import annotations

import os
import stat
import sys
import threading

import numpy as np
import pytest

import neural_arch as na
from neural_arch._files import is_stream, write_whole

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


def _written_through_fifo(tmp_path, write) -> bytes:
    """Run ``write(path)`` on a FIFO while a thread reads it; the bytes that came through."""
    fifo = str(tmp_path / "stream")
    os.mkfifo(fifo)
    received = []

    def read() -> None:
        with open(fifo, "rb") as handle:
            received.append(handle.read())
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        write(fifo)
    finally:
        # A write that opened the FIFO and closed it lets the reader end; a loaded machine may
        # take a while to run it (checking ``is_alive`` at once and then opening the FIFO to
        # write, as this did, waited for ever for a reader that had already read and gone).
        reader.join(10)
        if reader.is_alive():  # a write that never opened the FIFO: release the reader, which
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))  # waits in open() for a writer
            reader.join(10)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode), "the FIFO was replaced by a regular file"
    assert not [n for n in os.listdir(tmp_path) if n.endswith(".tmp") or ".tmp" in n]
    return received[0]


def test_is_stream_tells_devices_and_pipes_from_files(tmp_path):
    regular = tmp_path / "file"
    regular.write_text("x")
    os.symlink(os.devnull, tmp_path / "null_link")
    assert is_stream(os.devnull) and is_stream(str(tmp_path / "null_link"))
    assert not is_stream(str(regular)) and not is_stream(str(tmp_path / "missing"))
    assert not is_stream(str(tmp_path))


def test_write_whole_still_renames_over_a_regular_file(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text("old")
    inode = os.stat(path).st_ino
    write_whole(str(path), "new", str(path) + ".tmp")
    assert path.read_text() == "new" and os.stat(path).st_ino != inode  # a new file, renamed
    assert sorted(os.listdir(tmp_path)) == ["out.txt"]


def test_save_writes_into_a_pipe(tmp_path):
    data = _written_through_fifo(tmp_path, lambda p: na.save({"w": np.arange(3.0)}, p))
    copy = tmp_path / "copy.pt"
    copy.write_bytes(data)
    np.testing.assert_array_equal(na.load(str(copy))["w"], np.arange(3.0))


def test_profiler_trace_writes_into_a_pipe(tmp_path):
    from neural_arch.distributed.profiler import CommunicationProfiler
    data = _written_through_fifo(tmp_path, CommunicationProfiler().export_chrome_trace)
    assert b'"traceEvents"' in data


def test_monitor_statistics_write_into_a_pipe(tmp_path):
    from neural_arch.tabgpt.training.monitor import DistributedTrainingMonitor
    monitor = DistributedTrainingMonitor(log_dir=str(tmp_path / "logs"))
    data = _written_through_fifo(tmp_path, monitor.save_statistics)
    assert data.startswith(b"{")


def test_benchmark_report_writes_into_a_pipe(tmp_path):
    sys.path.insert(0, os.path.join(REPO_ROOT, "benchmarks"))
    try:
        import bench_reporting
    finally:
        sys.path.remove(os.path.join(REPO_ROOT, "benchmarks"))
    data = _written_through_fifo(
        tmp_path, lambda p: bench_reporting.write_section(p, "section", "a table"))
    assert data == b"<!-- section:start -->\na table\n<!-- section:end -->\n"
