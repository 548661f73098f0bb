"""Streaming stores into the shared workspace: the copy itself, the writer's choice, and the
direct collectives on real rank processes with every large copy streamed."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from neural_arch.backends import numba_backend
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import writer as shm_stores
from neural_arch.distributed.transports.base import Fingerprint
from neural_arch.distributed.transports.shm.writer import (EXPLORE_EVERY, MIN_TIMED_BYTES,
                                                           SLOW_STREAK, AreaWriter)
from shm_testing import run_ranks, shm_names_of

pytestmark = pytest.mark.timeout(240)
needs_numba = pytest.mark.skipif(not numba_backend.is_available(),
                                 reason=numba_backend.unavailable_reason() or "no Numba")
MIB = 1 << 20


# ----- the streaming copy ---------------------------------------------------------------------
@needs_numba
@pytest.mark.parametrize("nbytes", [0, 1, 31, 32, 33, 63, 64, 65, 1000, 4096 + 7, MIB + 3])
@pytest.mark.parametrize("dst_offset,src_offset", [(0, 0), (1, 0), (0, 3), (17, 5), (32, 31)])
def test_stream_copy_copies_every_byte(nbytes, dst_offset, src_offset):
    from neural_arch.distributed.transports.shm.stream import stream_copy
    rng = np.random.default_rng(nbytes)
    source = rng.integers(0, 256, nbytes + 64, dtype=np.uint8)
    target = np.zeros(nbytes + 128, np.uint8)
    stream_copy(target[dst_offset:dst_offset + nbytes], source[src_offset:src_offset + nbytes])
    assert np.array_equal(target[dst_offset:dst_offset + nbytes],
                          source[src_offset:src_offset + nbytes])
    # nothing outside the destination was touched
    assert not target[:dst_offset].any() and not target[dst_offset + nbytes:].any()


@needs_numba
@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.int64])
def test_stream_copy_keeps_values_of_every_dtype(dtype):
    from neural_arch.distributed.transports.shm.stream import stream_copy
    source = (np.arange(100_003) % 251 - 125).astype(dtype)
    target = np.empty_like(source)
    stream_copy(target, source)
    assert np.array_equal(target.view(np.uint8), source.view(np.uint8))


@needs_numba
def test_stream_copy_rejects_mismatched_arrays():
    from neural_arch.distributed.transports.shm.stream import stream_copy
    with pytest.raises(ValueError, match="float32.*float64"):
        stream_copy(np.empty(4, np.float32), np.empty(4, np.float64))
    with pytest.raises(ValueError, match=r"\[4\].*\[5\]"):
        stream_copy(np.empty(4, np.float32), np.empty(5, np.float32))
    with pytest.raises(ValueError, match="C-contiguous"):
        stream_copy(np.empty(4, np.float32), np.empty(8, np.float32)[::2])
    read_only = np.empty(4, np.float32)
    read_only.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        stream_copy(read_only, np.empty(4, np.float32))


# ----- the writer's choice --------------------------------------------------------------------
class ScriptedCopies:
    """A clock and a streaming copy whose durations the test sets: each write reads the clock
    before and after, and the second reading adds the duration of the kind that ran."""

    def __init__(self, plain_ns: float, stream_ns: float) -> None:
        self.plain_ns, self.stream_ns = plain_ns, stream_ns
        self.now, self.started, self.streamed = 0.0, False, False
        self.stream_calls = self.builds = 0

    def clock(self) -> float:
        if not self.started:
            self.started, self.streamed = True, False
            return self.now
        self.started = False
        self.now += self.stream_ns if self.streamed else self.plain_ns
        return self.now

    def stream(self, dst: np.ndarray, src: np.ndarray) -> None:
        self.streamed = True
        self.stream_calls += 1
        np.copyto(dst, src)

    def build(self):
        self.builds += 1
        return self.stream


@pytest.fixture
def scripted(monkeypatch):
    copies = ScriptedCopies(plain_ns=50e3, stream_ns=100e3)  # 1 MiB: ~21 GB/s, ~10 GB/s
    monkeypatch.setattr(shm_stores, "streaming_copy", copies.build)
    return copies


def write_many(writer: AreaWriter, count: int, copies: ScriptedCopies) -> int:
    """Make ``count`` 1 MiB writes; return how many streamed. Every write must copy."""
    before = copies.stream_calls
    src = np.arange(MIB // 8, dtype=np.float64)
    for k in range(count):
        dst = np.zeros_like(src)
        writer.write(dst, src + k)
        assert np.array_equal(dst, src + k)
    return copies.stream_calls - before


def test_fast_plain_copies_never_build_streaming(scripted):
    writer = AreaWriter("auto", clock=scripted.clock)
    assert write_many(writer, 3 * EXPLORE_EVERY, scripted) == 0
    assert scripted.builds == 0 and writer.stream is None and writer.kind == "plain"


def test_slow_plain_copies_switch_to_streaming_and_back(scripted):
    writer = AreaWriter("auto", clock=scripted.clock)
    scripted.plain_ns = 500e3  # ~2.1 GB/s, as seen without a shared cache
    assert write_many(writer, SLOW_STREAK - 1, scripted) == 0
    assert scripted.builds == 0  # a few slow copies could be a hiccup
    assert write_many(writer, 1, scripted) == 0 and scripted.builds == 1
    assert write_many(writer, 1, scripted) == 1  # the first streamed write measures it
    assert writer.kind == "stream"
    streamed = write_many(writer, 4 * EXPLORE_EVERY, scripted)
    assert streamed == 4 * EXPLORE_EVERY - 4  # one write in EXPLORE_EVERY tries plain again
    scripted.plain_ns = 50e3  # the cores share a cache again
    write_many(writer, 12 * EXPLORE_EVERY, scripted)
    assert writer.kind == "plain"
    assert write_many(writer, EXPLORE_EVERY, scripted) == 1
    assert scripted.builds == 1


def test_streaming_only_while_much_faster(scripted):
    writer = AreaWriter("auto", clock=scripted.clock)
    scripted.plain_ns, scripted.stream_ns = 500e3, 300e3  # slow, but streaming not 2x faster
    write_many(writer, SLOW_STREAK + 1 + 4 * EXPLORE_EVERY, scripted)
    assert writer.kind == "plain"


def test_small_copies_are_plain_and_untimed(scripted):
    writer = AreaWriter("auto", clock=scripted.clock)
    scripted.plain_ns = 1e9
    src = np.arange(MIN_TIMED_BYTES // 8 - 1, dtype=np.float64)
    dst = np.zeros_like(src)
    for _ in range(2 * SLOW_STREAK):
        writer.write(dst, src)
    assert np.array_equal(dst, src)
    assert scripted.now == 0 and scripted.builds == 0 and writer.writes == 0


def test_without_numba_slow_copies_stay_plain(monkeypatch):
    monkeypatch.setenv(numba_backend.ENV_SWITCH, "0")
    numba_backend.reset()
    try:
        copies = ScriptedCopies(plain_ns=500e3, stream_ns=1.0)
        writer = AreaWriter("auto", clock=copies.clock)
        write_many(writer, SLOW_STREAK + 2 * EXPLORE_EVERY, copies)
        assert writer.stream is False and writer.kind == "plain"
        with pytest.raises(ValueError, match="needs the streaming copy.*NEURAL_ARCH_NUMBA=0"):
            AreaWriter("stream")
    finally:
        monkeypatch.delenv(numba_backend.ENV_SWITCH)
        numba_backend.reset()


@needs_numba
def test_a_kernel_that_cannot_be_built_leaves_copies_plain(monkeypatch):
    import neural_arch.distributed.transports.shm.stream as numba_stream

    def broken(dst, src):
        raise RuntimeError("no vector stores here")
    monkeypatch.setattr(shm_stores, "_built", {})
    monkeypatch.setattr(numba_stream, "stream_copy", broken)
    with pytest.warns(RuntimeWarning, match="could not be built.*no vector stores here"):
        assert shm_stores.streaming_copy() is None
    assert "no vector stores here" in shm_stores.why_no_streaming()
    copies = ScriptedCopies(plain_ns=500e3, stream_ns=1.0)
    writer = AreaWriter("auto", clock=copies.clock)
    write_many(writer, SLOW_STREAK + EXPLORE_EVERY, copies)
    assert writer.stream is False and writer.kind == "plain"
    with pytest.raises(ValueError, match="needs the streaming copy.*no vector stores here"):
        AreaWriter("stream")


def test_choice_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv(shm_stores.ENV_CHOICE, "plain")
    assert AreaWriter().kind == "plain"
    monkeypatch.setenv(shm_stores.ENV_CHOICE, "Auto ")
    assert AreaWriter().choice == "auto"
    monkeypatch.setenv(shm_stores.ENV_CHOICE, "fast")
    with pytest.raises(ValueError, match="NEURAL_ARCH_SHM_STORES must be auto, plain or "
                                         "stream, got 'fast'"):
        AreaWriter()


# ----- the direct collectives with every large copy streamed ----------------------------------
def streamed_collectives(rank, p, store):
    """Run each direct collective with sizes that take several streamed rounds; return the
    failures, how many copies streamed, and digests of the float results."""
    t = shm.create(rank, p, store, 60.0)
    writer = t.collectives.writer = AreaWriter("stream")
    counted = {"calls": 0}
    stream = writer.stream

    def counting(dst, src):
        counted["calls"] += 1
        stream(dst, src)
    writer.stream = counting
    failures, digests, seq = [], [], 0

    def fp(op, arr):
        nonlocal seq
        seq += 1
        return Fingerprint(op, seq, arr.dtype.name, arr.size)
    try:
        for n, dtype in ((300_007, np.float32), (1_048_583, np.float64), (655_361, np.int32)):
            i = np.arange(n)
            # all-reduce: integers, exact in every dtype
            buf = ((rank + 1) * (i % 7 - 3)).astype(dtype)
            t.collectives.all_reduce(buf, ReduceOp.SUM, fp("all_reduce", buf))
            if not np.array_equal(buf, (p * (p + 1) // 2 * (i % 7 - 3)).astype(dtype)):
                failures.append(("all_reduce", n))
            # all-reduce of random floats: the rank-order sum, the same bits everywhere
            if dtype == np.float32:
                inputs = [np.random.default_rng([r, n]).uniform(-1, 1, n).astype(dtype)
                          for r in range(p)]
                expected = inputs[0].copy()
                for other in inputs[1:]:
                    np.add(expected, other, out=expected)
                buf = inputs[rank].copy()
                t.collectives.all_reduce(buf, ReduceOp.SUM, fp("all_reduce", buf))
                if not np.array_equal(buf.view(np.uint8), expected.view(np.uint8)):
                    failures.append(("all_reduce floats", n))
                digests.append(hashlib.sha256(buf.tobytes()).hexdigest())
            for root in range(p):
                data = (i * (root + 3) % 1000).astype(dtype)
                buf = data.copy() if rank == root else np.full(n, -1, dtype)
                t.collectives.broadcast(buf, root, fp("broadcast", buf))
                if not np.array_equal(buf, data):
                    failures.append(("broadcast", n, root))
            mine = (i % 97 + 100 * rank).astype(dtype)
            out = np.full(p * n, -1, dtype)
            t.collectives.all_gather(mine, out, fp("all_gather", mine))
            if not np.array_equal(out, np.concatenate([(i % 97 + 100 * r).astype(dtype)
                                                       for r in range(p)])):
                failures.append(("all_gather", n))
            send = np.concatenate([((r + 1) * (rank + 1) * (i % 5)).astype(dtype)
                                   for r in range(p)])
            recv = np.full(n, -1, dtype)
            t.collectives.reduce_scatter(send, recv, ReduceOp.SUM, fp("reduce_scatter", send))
            if not np.array_equal(recv, ((rank + 1) * p * (p + 1) // 2 * (i % 5)).astype(dtype)):
                failures.append(("reduce_scatter", n))
        return failures, counted["calls"], digests
    finally:
        t.close()


@needs_numba
@pytest.mark.parametrize("p", [2, 3, 4])
def test_direct_collectives_with_streaming_stores(tmp_path, p):
    results = run_ranks(p, streamed_collectives, store_dir=str(tmp_path), timeout=200)
    assert all(r.ok for r in results), results
    for r in results:
        failures, streamed, digests = r.value
        assert failures == [], f"rank {r.rank}: {failures}"
        assert streamed > 0, f"rank {r.rank} streamed no copy"
        assert digests == results[0].value[2]
    assert shm_names_of(r.pid for r in results) == []
