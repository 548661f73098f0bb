"""No shared-memory segment outlives its job: normal exit, exceptions, SIGTERM and SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.base import Fingerprint
from repo_paths import REPO_ROOT, TESTS_DIR
from shm_testing import DirStore, run_ranks, shm_names_of

pytestmark = pytest.mark.timeout(120)

SEGMENT_KEY = "shm/nf_segment"


def segment_exists(name: str) -> bool:
    return os.path.exists(f"/dev/shm/{name}")


def segment_name(store_dir) -> str:
    return json.loads(DirStore(str(store_dir)).get(SEGMENT_KEY, timeout=30))["name"]


def work_then_leave(rank, p, store, how):
    t = shm.create(rank, p, store, 30.0)
    # the name is unlinked as soon as every rank mapped it; the mapping keeps working
    listed = segment_exists(t.segment_name)
    buf = np.full(1000, rank + 1.0)
    t.collectives.all_reduce(buf, ReduceOp.SUM, Fingerprint("all_reduce", 1, "float64", 1000))
    if how == "raise":
        raise RuntimeError("failing on purpose without closing")
    t.close()
    return listed, float(buf[0])


@pytest.mark.parametrize("how", ["close", "raise"])
def test_no_segment_after_normal_exit_or_exception(tmp_path, how):
    results = run_ranks(3, work_then_leave, how, store_dir=str(tmp_path), timeout=60)
    for r in results:
        if how == "close":
            assert r.ok and r.value == (False, 6.0), r
        else:
            assert r.error == "RuntimeError", r
    assert not segment_exists(segment_name(tmp_path))
    assert shm_names_of(r.pid for r in results) == []


def loop_until_killed(rank, p, store, marker_dir):
    t = shm.create(rank, p, store, 60.0)
    Path(marker_dir, f"ready.{rank}").touch()
    buf = np.ones(100_000, np.float32)
    seq = 0
    while True:
        seq += 1
        t.collectives.all_reduce(buf, ReduceOp.MAX, Fingerprint("all_reduce", seq, "float32",
                                                                buf.size))


def test_no_segment_after_every_rank_is_sigkilled(tmp_path):
    markers = tmp_path / "markers"
    markers.mkdir()
    pids = []

    def kill_all_when_busy(procs):
        pids.extend(p.pid for p in procs)
        deadline = time.monotonic() + 60
        while len(list(markers.iterdir())) < len(procs) and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)  # let them run collectives for a while
        for proc in procs:
            os.kill(proc.pid, signal.SIGKILL)

    results = run_ranks(4, loop_until_killed, str(markers), store_dir=str(tmp_path),
                        timeout=60, on_start=kill_all_when_busy)
    assert [r.exitcode for r in results] == [-signal.SIGKILL] * 4
    assert len(list(markers.iterdir())) == 4
    assert not segment_exists(segment_name(tmp_path))
    assert shm_names_of(pids) == []


def lonely_creator(rank, p, store):
    shm.create(rank, p, store, 1.0)
    return "created"


def test_rendezvous_timeout_unlinks_the_segment(tmp_path):
    # world_size 2 but only rank 0 runs: it waits for rank 1 to map the segment, then gives up
    results = run_ranks(1, lambda rank, p, store: lonely_creator(0, 2, store),
                        store_dir=str(tmp_path), timeout=60)
    assert results[0].error == "CollectiveTimeoutError", results[0]
    assert "shm_rendezvous" in results[0].message and "rank 0" in results[0].message
    assert not segment_exists(segment_name(tmp_path))


def run_script(body: str, tmp_path) -> subprocess.Popen:
    code = textwrap.dedent("""
        import os, signal, sys, time
        from shm_testing import DirStore
        from neural_arch.distributed.transports import shm
        store_dir = sys.argv[1]
    """) + textwrap.dedent(body)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)]))
    return subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


WAIT_IN_RENDEZVOUS = """\
    shm.create(0, 2, DirStore(store_dir), 60.0)  # rank 1 never comes
"""


@pytest.mark.parametrize("previous", ["default", "chained"])
def test_sigterm_during_rendezvous_unlinks_and_chains(tmp_path, previous):
    setup = "" if previous == "default" else \
        "    signal.signal(signal.SIGTERM, lambda *a: os._exit(3))\n"
    proc = run_script(setup + WAIT_IN_RENDEZVOUS, tmp_path)
    try:
        store = DirStore(str(tmp_path))
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                name = json.loads(store.get(SEGMENT_KEY, timeout=0.05))["name"]
                break
            except TimeoutError:
                pass
        assert proc.poll() is None, proc.stderr.read()
        deadline = time.monotonic() + 30
        while not segment_exists(name) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert segment_exists(name)  # still waiting for rank 1: the name is still needed
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == (-signal.SIGTERM if previous == "default" else 3), proc.stderr.read()
    assert not segment_exists(name)


@pytest.mark.parametrize("ending", ["sys.exit(0)", "raise SystemExit(4)",
                                    "raise RuntimeError('boom')"])
def test_atexit_unlinks_a_segment_that_was_never_joined(tmp_path, ending):
    proc = run_script(f"""
        name = "nf_%d_atexit" % os.getpid()
        shm.create_segment(name, 4096)
        print(name, flush=True)
        {ending}
    """, tmp_path)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    name = out.decode().split()[0]
    assert name.startswith("nf_")
    assert proc.returncode != 0 or ending == "sys.exit(0)", err
    assert not segment_exists(name)


def test_sigterm_handler_is_restored_once_unlinked(tmp_path):
    proc = run_script("""
        def mine(signum, frame):
            pass
        signal.signal(signal.SIGTERM, mine)
        shm.create_segment("nf_%d_restore" % os.getpid(), 4096)
        during = signal.getsignal(signal.SIGTERM) is not mine
        shm.unlink_segment("nf_%d_restore" % os.getpid())
        after = signal.getsignal(signal.SIGTERM) is mine
        print(during, after)
    """, tmp_path)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert out.decode().split() == ["True", "True"], err
