"""DataLoader workers that fail, die or hang are reported by name, and no worker outlives its
loader, its iterator or its main process."""
import gc
import os
import subprocess
import sys
import time

import pytest

from leftovers import alive, wait_gone
from neural_arch.data import DataLoader
from worker_leftovers import leftovers  # noqa: F401 - no worker outlives a test
from worker_datasets import Probe, keep_items

pytestmark = pytest.mark.timeout(60)
HERE = os.path.dirname(os.path.abspath(__file__))


def _pids(batch):
    return {item["pid"] for item in batch}


def _gone(pids, limit=5.0):
    """No process of ``pids`` left within ``limit`` seconds (os.kill(pid, 0) fails for each)."""
    wait_gone(pids, limit)
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return alive(pid) is False  # a zombie not yet reaped by its parent counts as gone
    return True


def test_exception_in_getitem_is_raised_naming_the_worker():
    loader = DataLoader(Probe(12, fail_at=5), batch_size=2, num_workers=2,
                        collate_fn=keep_items)
    with pytest.raises(KeyError) as caught:  # index 5 is in batch 2, which worker 0 makes
        list(loader)
    text = str(caught.value)
    assert "Caught KeyError in DataLoader worker process 0 while making batch 2" in text
    assert "Original Traceback (most recent call last)" in text
    assert "index 5 is unreadable" in text and "worker_datasets.py" in text
    del caught  # its traceback, through this frame, keeps the iterator and its workers alive


def test_exception_in_worker_init_fn_is_raised_naming_the_worker():
    def broken_init(worker_id):
        raise ValueError(f"cannot open the shard of worker {worker_id}")
    loader = DataLoader(Probe(4), batch_size=2, num_workers=2, worker_init_fn=broken_init,
                        collate_fn=keep_items)
    with pytest.raises(ValueError, match=r"(?s)worker process 0 in worker_init_fn.*cannot open "
                                         r"the shard of worker 0"):
        list(loader)


def test_a_killed_worker_is_a_runtime_error_naming_it():
    loader = DataLoader(Probe(12, kill_at=3), batch_size=2, num_workers=2, timeout=20,
                        collate_fn=keep_items)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"DataLoader worker 1 \(pid \d+\) is killed by "
                                           r"signal: Killed \(SIGKILL\)"):
        list(loader)
    assert time.monotonic() - started < 10
    loader = DataLoader(Probe(12, exit_at=4), batch_size=2, num_workers=2, collate_fn=keep_items)
    with pytest.raises(RuntimeError, match=r"DataLoader worker 0 \(pid \d+\) exited unexpectedly "
                                           r"with exit code 3"):
        list(loader)


def test_timeout_names_the_batch_and_worker():
    loader = DataLoader(Probe(8, hang_at=2), batch_size=2, num_workers=2, timeout=0.5,
                        collate_fn=keep_items)
    with pytest.raises(RuntimeError, match=r"DataLoader timed out after 0.5 seconds waiting for "
                                           r"batch 1 from worker 1 \(pid \d+\)"):
        list(loader)


def test_persistent_workers_keep_their_pids_others_restart():
    persistent = DataLoader(Probe(8), batch_size=2, num_workers=2, persistent_workers=True,
                            collate_fn=keep_items)
    epochs = [set().union(*map(_pids, persistent)) for _ in range(3)]
    assert len(epochs[0]) == 2 and epochs[0] == epochs[1] == epochs[2]
    it = iter(persistent)
    next(it)  # an epoch left early: its late batches must not leak into the next one
    assert [item["index"] for b in persistent for item in b] == list(range(8))
    del it, persistent
    assert _gone(epochs[0])  # the loader is gone, and so are its workers
    fresh = DataLoader(Probe(8), batch_size=2, num_workers=2, collate_fn=keep_items)
    first, second = (set().union(*map(_pids, fresh)) for _ in range(2))
    assert len(first) == len(second) == 2 and not first & second
    assert _gone(first)  # ended with their epoch


def test_no_worker_survives_del_break_or_garbage_collection():
    loader = DataLoader(Probe(40), batch_size=2, num_workers=2, collate_fn=keep_items)
    it = iter(loader)
    pids = _pids(next(it)) | _pids(next(it))
    del it
    assert len(pids) == 2 and _gone(pids)
    for batch in loader:
        pids = _pids(batch)
        break
    assert _gone(pids)

    def epoch_in_a_function():
        local = DataLoader(Probe(40), batch_size=2, num_workers=2, persistent_workers=True,
                           collate_fn=keep_items)
        it = iter(local)
        return _pids(next(it)) | _pids(next(it))
    pids = epoch_in_a_function()
    gc.collect()
    assert len(pids) == 2 and _gone(pids)


def test_workers_end_when_the_main_process_is_killed(leftovers):
    result = subprocess.run([sys.executable, os.path.join(HERE, "worker_main_dies.py")],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == -9, result.stderr
    pids = [int(p) for p in result.stdout.split()]
    leftovers.add(pids)  # re-parented away from this process tree
    assert len(pids) == 2 and _gone(pids, limit=5.0)
