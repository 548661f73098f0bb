"""The process facts the MPI pid watch, the backend choice and checkpoint writers rely on."""
from __future__ import annotations

import os
import subprocess
import sys
import time

from neural_arch.distributed import processes


def test_process_alive_checks_pid_zombie_and_reuse():
    me = os.getpid()
    start = processes.process_stat(me)
    assert processes.process_alive(me, start[1] if start else 0)
    if start:
        assert not processes.process_alive(me, start[1] + 1)  # same pid, another process
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while processes.process_alive(child.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not processes.process_alive(child.pid)  # exited; a zombie until reaped
    finally:
        child.wait(10)
    assert not processes.process_alive(child.pid)


def test_host_identity_is_stable_and_names_the_namespace():
    assert processes.host_identity("pid") == processes.host_identity("pid")
    if os.path.exists("/proc/self/ns/ipc"):
        assert processes.host_identity("ipc").endswith(str(os.stat("/proc/self/ns/ipc").st_ino))
