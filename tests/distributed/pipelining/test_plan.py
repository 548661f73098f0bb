"""The schedules' orders (Megatron-LM's) and proof that their rounds cannot deadlock.

``no_deadlock`` plays a plan out on the strictest transport there could be: no buffering at
all, a message moves only while both its sender's and its receiver's current batch hold it
(MPI's rendezvous). Each round is two batches per rank (headers and gradients, then activation
payloads), as ``transfer`` sends them.
"""
import pytest

from neural_arch.distributed.pipelining.plan import (COST, KINDS, build_plan, interleaved_bubble,
                                                     interleaved_rounds, rank_order)


def _names(order):
    return [f"{a.kind}{a.mb}" if a.chunk == 0 else f"{a.kind}{a.mb}.{a.chunk}" for a in order]


def test_1f1b_order_is_megatrons():
    assert _names(rank_order("1f1b", 0, 2, 4)) == "F0 F1 B0 F2 B1 F3 B2 B3".split()
    assert _names(rank_order("1f1b", 1, 2, 4)) == "F0 B0 F1 B1 F2 B2 F3 B3".split()
    assert _names(rank_order("1f1b", 0, 4, 2)) == "F0 F1 B0 B1".split()  # warm-up capped by m


def test_gpipe_runs_every_forward_first():
    assert _names(rank_order("gpipe", 1, 3, 3)) == "F0 F1 F2 B0 B1 B2".split()


def test_interleaved_order_is_megatrons():
    # p=2, v=2, m=4: warm-up (p - r - 1) * 2 + (v - 1) * p forwards, then 1F1B over chunks
    assert _names(rank_order("interleaved", 0, 2, 4, 2)) == (
        "F0 F1 F0.1 F1.1 F2 B0.1 F3 B1.1 F2.1 B0 F3.1 B1 B2.1 B3.1 B2 B3".split())
    assert _names(rank_order("interleaved", 1, 2, 4, 2)) == (
        "F0 F1 F0.1 B0.1 F1.1 B1.1 F2 B0 F3 B1 F2.1 B2.1 F3.1 B3.1 B2 B3".split())
    # as many micro-batches as ranks: all forwards first (Megatron-LM's all-warm-up case)
    assert _names(rank_order("interleaved", 0, 2, 2, 2)) == (
        "F0 F1 F0.1 F1.1 B0.1 B1.1 B0 B1".split())


def test_interleaved_takes_any_number_of_micro_batches():
    # PyTorch's rounds: max(1, m // p) of them; 5 for 2 ranks splits as evenly as it can
    assert interleaved_rounds(2, 5) == [3, 2]
    assert interleaved_rounds(4, 6) == [6] and interleaved_rounds(4, 2) == [2]
    assert interleaved_rounds(3, 8) == [4, 4] and interleaved_rounds(2, 8) == [2, 2, 2, 2]
    # p=2, m=3: one round of three; warm-up 2(p - r - 1) + (v - 1) * 3
    assert _names(rank_order("interleaved", 0, 2, 3, 2)) == (
        "F0 F1 F2 F0.1 F1.1 F2.1 B0.1 B1.1 B2.1 B0 B1 B2".split())
    assert _names(rank_order("interleaved", 1, 2, 3, 2)) == (
        "F0 F1 F2 F0.1 B0.1 F1.1 B1.1 F2.1 B2.1 B0 B1 B2".split())
    # fewer micro-batches than ranks: one short round
    assert _names(rank_order("interleaved", 3, 4, 2, 2)) == (
        "F0 F1 F0.1 B0.1 F1.1 B1.1 B0 B1".split())


def _modelled_bubble(plan, m, v):
    """Idle fraction of the plan's clock: every rank has m * v forwards and backwards to run."""
    end = max(s.tick + COST[s.action.kind] for steps in plan.steps for s in steps if s.action)
    return 1 - m * v * (COST["F"] + COST["B"]) / end


def test_interleaved_bubble_is_the_formula_for_every_micro_batch_count():
    for p in range(1, 6):
        for m in range(1, 17):
            for v in (1, 2, 3):
                modelled = _modelled_bubble(build_plan("interleaved", p, m, v), m, v)
                assert modelled == pytest.approx(interleaved_bubble(p, m, v), abs=1e-12), (p, m, v)
                if m >= p:  # p need not divide m for the textbook bubble
                    assert modelled == pytest.approx((p - 1) / (v * m + p - 1), abs=1e-12)


def _batches(plan):
    """Per rank, its batches in order: each a set of message ids (empty ones dropped); every
    batch of the plan is two, headers and gradients first, then activation payloads."""
    out = []
    for steps in plan.steps:
        seq = []
        for step in steps:
            for sends, recvs in step.batches:
                msgs = list(sends) + list(recvs)
                first = {(m.kind, m.stage, m.mb, "A") for m in msgs}
                second = {(m.kind, m.stage, m.mb, "B") for m in msgs if m.kind == "act"}
                seq += [b for b in (first, second) if b]
        out.append(seq)
    return out


def _ends(plan):
    ends = {}
    for steps in plan.steps:
        for step in steps:
            for m in step.sends + step.recvs:
                for phase in "AB":
                    ends[(m.kind, m.stage, m.mb, phase)] = (m.src, m.dst)
    return ends


def no_deadlock(seqs, ends):
    """Whether ranks running ``seqs`` (per rank, batches of message ids) all finish when a
    message moves only while both ends' current batches hold it."""
    ptr = [0] * len(seqs)
    done = set()
    while any(ptr[r] < len(seqs[r]) for r in range(len(seqs))):
        moved = False
        for r, seq in enumerate(seqs):
            if ptr[r] == len(seq):
                continue
            for msg in seq[ptr[r]] - done:
                src, dst = ends[msg]
                other = dst if r == src else src
                if ptr[other] < len(seqs[other]) and msg in seqs[other][ptr[other]]:
                    done.add(msg)
                    moved = True
        for r, seq in enumerate(seqs):
            while ptr[r] < len(seq) and seq[ptr[r]] <= done:
                ptr[r] += 1
                moved = True
        if not moved:
            return False
    return True


def test_the_checker_finds_the_deadlock_of_two_plain_sends():
    # each rank sends first, then receives: with no buffering neither send can finish
    ends = {"a": (0, 1), "b": (1, 0)}
    assert not no_deadlock([[{"a"}, {"b"}], [{"b"}, {"a"}]], ends)
    assert no_deadlock([[{"a", "b"}], [{"a", "b"}]], ends)  # one batch each: both move


@pytest.mark.parametrize("kind", KINDS)
def test_every_plan_finishes_without_buffering(kind):
    for p in range(1, 6):
        for m in range(1, 10):
            for v in ((1, 2, 3) if kind == "interleaved" else (1,)):
                plan = build_plan(kind, p, m, v)
                assert no_deadlock(_batches(plan), _ends(plan)), (kind, p, m, v)
                # every rank runs every pass of its chunks exactly once
                for r, steps in enumerate(plan.steps):
                    ran = sorted(s.action for s in steps if s.action is not None)
                    assert ran == sorted(rank_order(kind, r, p, m, v))


def test_peak_activations():
    assert build_plan("1f1b", 4, 8).peak == [4, 3, 2, 1]
    assert build_plan("gpipe", 4, 8).peak == [8] * 4
