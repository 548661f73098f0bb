"""Whether peer reads pay (``read_cost``): the timing at set-up, the ranks' agreement on it,
and the built-in all-reduce choice that follows it, with the reference's bits either way."""
from __future__ import annotations

import os

import numpy as np
import pytest

from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import cross_memory, read_cost, tuning
from shm_cases import Calls, rank_order_reduction
from shm_testing import run_ranks

PAIR_N = tuning.PEER_READ_MIN_BYTES[2] // 4 + 1  # float32: above the built-in peer-read size


def _can_read_self() -> bool:
    reads = cross_memory.PeerReads(0, 1)
    try:
        return reads.read_cost_ratio() is not None
    finally:
        reads.close()


needs_peer_reads = pytest.mark.skipif(not _can_read_self(),
                                      reason="this machine refuses cross-memory reads")


pytestmark = [pytest.mark.timeout(60), pytest.mark.usefixtures("built_in_table")]


def paying(rank, p, store, switch, pays_on):
    """``NEURAL_ARCH_SHM_PEER_READ=switch``; ``reads_pay`` answers yes on the ranks in
    ``pays_on`` (None: the real timing). Returns whether peer reads were agreed and pay, both
    after ``close``, the built-in choice for a vector above PEER_READ_MIN_BYTES, whether its
    public all-reduce has the reference's bits, and what moved through the kernel."""
    os.environ[cross_memory.ENV_SWITCH] = switch
    if pays_on is not None:
        cross_memory.PeerReads.reads_pay = lambda self: rank in pays_on
    t = shm.create(rank, p, store, 30.0)
    moved, real_read = [], t.peer_reads.read
    t.peer_reads.read = lambda *args: moved.append("read") or real_read(*args)
    try:
        inputs = [np.random.default_rng([r, PAIR_N]).uniform(-2, 2, PAIR_N).astype(np.float32)
                  for r in range(p)]
        buf = inputs[rank].copy()
        level = tuning.peer_level(t.peer_reads.usable, t.peer_reads.writable)
        chosen = tuning.decide(p, buf.nbytes, t.layout.workspace_bytes, level,
                               t.peer_reads.pays)[0]
        t.collectives.all_reduce(buf, ReduceOp.SUM, Calls().fp("all_reduce", buf))
        same = buf.tobytes() == rank_order_reduction(inputs, ReduceOp.SUM).tobytes()
        usable, pays = t.peer_reads.usable, t.peer_reads.pays
        t.close()
        closed = (t.peer_reads.usable, t.peer_reads.pays)
        return usable, pays, closed, chosen.algorithm, same, sorted(set(moved))
    finally:
        t.close()


@needs_peer_reads
@pytest.mark.parametrize("switch,pays_on,pays", [("auto", (0, 1), True), ("auto", (1,), False),
                                                 ("auto", (), False), ("read", (), False),
                                                 ("on", (), True)])
def test_the_built_in_choice_takes_peer_reads_only_where_every_rank_found_them_paying(
        tmp_path, switch, pays_on, pays):
    """``on`` takes reads as paying without asking ``reads_pay`` (which says no here);
    ``read`` is timed as ``auto``."""
    results = run_ranks(2, paying, switch, pays_on, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    for r in results:
        usable, agreed, closed, algorithm, same, moved = r.value
        assert usable is True and closed == (False, False), r.value  # close() undoes both
        assert agreed is pays and same is True, r.value
        assert algorithm == ("peer_read" if pays else "whole"), r.value
        assert moved == (["read"] if pays else []), r.value


@needs_peer_reads
def test_the_ranks_agree_on_whether_reads_pay_when_they_time_them(tmp_path):
    results = run_ranks(2, paying, "auto", None, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    assert results[0].value == results[1].value, [r.value for r in results]
    _, pays, _, algorithm, same, _ = results[0].value
    assert same is True and algorithm == ("peer_read" if pays else "whole")


def test_the_ratio_is_the_best_read_over_the_best_copy(monkeypatch):
    reads = []  # (pid, remote, local, nbytes) of every read the probe made

    def read(pid, remote, local, nbytes):
        reads.append((pid, remote, local, nbytes))
        return nbytes
    ticks = iter(range(10 ** 6))  # every timed span is one tick: a read costs one copy
    monkeypatch.setattr(read_cost.time, "perf_counter", lambda: next(ticks))
    assert read_cost.ratio(read) == 1.0 and read_cost.pays(read) is True
    assert len(reads) == 2 * read_cost.BUFFERS * (read_cost.TRIES + 1)  # one untimed a pair
    assert {(pid, n) for pid, _, _, n in reads} == {(os.getpid(), read_cost.PROBE_BYTES)}
    monkeypatch.setattr(read_cost, "PAYS_MAX_RATIO", 0.9)
    assert read_cost.pays(read) is False
    assert read_cost.ratio(lambda pid, remote, local, nbytes: nbytes - 1) is None
    assert read_cost.pays(lambda pid, remote, local, nbytes: -1) is False


@needs_peer_reads
def test_a_real_read_of_this_process_gives_a_positive_ratio():
    reads = cross_memory.PeerReads(0, 1)
    try:
        found = reads.read_cost_ratio()
        assert found is not None and 0 < found < 1000, found
        assert reads.reads_pay() in (True, False)
    finally:
        reads.close()


@pytest.mark.parametrize("value,allowed", [
    ("auto", cross_memory.READS | cross_memory.WRITES),
    ("on", cross_memory.READS | cross_memory.WRITES | cross_memory.PAYS),
    ("1", cross_memory.READS | cross_memory.WRITES | cross_memory.PAYS),
    ("read", cross_memory.READS), ("off", 0), ("0", 0)])
def test_the_switch_values(monkeypatch, value, allowed):
    monkeypatch.setenv(cross_memory.ENV_SWITCH, value)
    assert cross_memory.switched_on() == allowed


@pytest.mark.parametrize("enabled", [cross_memory.PAYS, cross_memory.WRITES, 2.0, None, 99])
def test_what_a_rank_may_do_is_checked(enabled):
    with pytest.raises(ValueError, match="enabled must be"):
        cross_memory.PeerReads(0, 2, enabled)
