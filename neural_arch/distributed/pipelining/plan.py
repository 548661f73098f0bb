"""What every rank of a pipeline does, and when: computed the same on every rank, no messages.

A schedule is first an order of work per rank (``rank_order``): which forward (F) and backward
(B) passes, of which model chunk and micro-batch, one after another. GPipe runs every forward,
then every backward; 1F1B (PipeDream-Flush, as Megatron-LM) runs ``p - r - 1`` forwards to warm
up, then alternates one forward and one backward, then drains the backwards, so rank ``r`` never
holds more than ``p - r`` micro-batches of activations; the interleaved schedule (Megatron-LM's
virtual pipeline) does the same over ``v`` chunks per rank, a group of ``p`` micro-batches per
chunk at a time.

Why a plan and not just the order: ranks must agree on which messages travel together.
``build_plan`` plays the orders out in lock-step rounds: in round ``t`` each rank runs its next
pass if its input arrived in an earlier round, then every message produced in round ``t`` is
exchanged in round ``t`` (one ``batch_isend_irecv`` per rank: the sender's and receiver's
batches hold exactly the same messages). Messages only link batches of the same round and
every rank meets its rounds in increasing order, so no rank can wait for a batch its peer only
reaches after waiting for this one: the exchange is deadlock-free under any transport, however
little it buffers. Ranks still run at their own pace: a rank only blocks on the batches it
takes part in.
"""
from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional, Tuple


class Action(NamedTuple):
    """One pass: ``kind`` "F" or "B" of model chunk ``chunk`` (of this rank) on ``mb``."""

    kind: str
    chunk: int
    mb: int


class Msg(NamedTuple):
    """An activation ("act") for virtual stage ``stage`` or the gradient ("grad") of virtual
    stage ``stage``'s output, for micro-batch ``mb``, from rank ``src`` to rank ``dst``."""

    kind: str
    stage: int
    mb: int
    src: int
    dst: int


class Step(NamedTuple):
    """One round of one rank: the pass it runs (or None), then the messages it exchanges."""

    round: int
    action: Optional[Action]
    sends: Tuple[Msg, ...]
    recvs: Tuple[Msg, ...]


KINDS = ("gpipe", "1f1b", "interleaved")


def rank_order(kind: str, rank: int, p: int, m: int, v: int = 1) -> List[Action]:
    """The passes rank ``rank`` of ``p`` runs, in order, for ``m`` micro-batches and ``v``
    chunks per rank (chunk ``c`` of rank ``r`` is virtual stage ``c * p + r``)."""
    if kind == "gpipe":
        return ([Action("F", c, i) for c in range(v) for i in range(m)]
                + [Action("B", c, i) for c in reversed(range(v)) for i in range(m)])
    if kind == "1f1b":
        warm = min(p - rank - 1, m)
        order = [Action("F", 0, i) for i in range(warm)]
        for i in range(m - warm):
            order += [Action("F", 0, warm + i), Action("B", 0, i)]
        return order + [Action("B", 0, i) for i in range(m - warm, m)]
    if kind != "interleaved":
        raise ValueError(f"unknown schedule kind {kind!r}; expected one of {KINDS}")
    if m % p:
        raise ValueError(f"the interleaved schedule needs n_microbatches divisible by the "
                         f"number of pipeline ranks (as Megatron-LM): got {m} micro-batches "
                         f"for {p} ranks")
    total = m * v
    # Megatron-LM: with as many micro-batches as ranks there is no steady state at all
    warm = total if m == p else min((p - rank - 1) * 2 + (v - 1) * p, total)

    def chunk(k: int, forward: bool) -> int:
        c = (k % (p * v)) // p
        return c if forward else v - 1 - c

    def mb(k: int) -> int:  # micro-batches go in groups of p through each chunk
        return (k // (p * v)) * p + k % p

    order = [Action("F", chunk(k, True), mb(k)) for k in range(warm)]
    for k in range(total - warm):
        order += [Action("F", chunk(k + warm, True), mb(k + warm)),
                  Action("B", chunk(k, False), mb(k))]
    return order + [Action("B", chunk(k, False), mb(k)) for k in range(total - warm, total)]


class Plan(NamedTuple):
    """Every rank's steps (``steps[r]``), and how many micro-batches of activations each rank
    holds at most at once (``peak[r]``, over all its chunks)."""

    steps: List[List[Step]]
    peak: List[int]


def build_plan(kind: str, p: int, m: int, v: int = 1) -> Plan:
    """Play the orders out in rounds (see the module docstring); raises RuntimeError if the
    orders cannot finish, which would be a bug in ``rank_order``."""
    orders = [rank_order(kind, r, p, m, v) for r in range(p)]
    last = p * v - 1
    arrived: Dict[Tuple[str, int, int], int] = {}  # (kind, stage, mb) -> round it moved in
    pos, held, peak = [0] * p, [0] * p, [0] * p
    steps: List[List[Step]] = [[] for _ in range(p)]
    t = 0
    while any(pos[r] < len(orders[r]) for r in range(p)):
        ran: Dict[int, Action] = {}
        sent: List[Msg] = []
        for r in range(p):
            if pos[r] == len(orders[r]):
                continue
            act = orders[r][pos[r]]
            stage = act.chunk * p + r
            if act.kind == "F":
                need = None if stage == 0 else ("act", stage, act.mb)
            else:
                need = None if stage == last else ("grad", stage, act.mb)
            if need is not None and arrived.get(need, t) >= t:
                continue  # its input has not come yet: this rank idles this round
            ran[r] = act
            pos[r] += 1
            if act.kind == "F":
                held[r] += 1
                peak[r] = max(peak[r], held[r])
                if stage < last:
                    sent.append(Msg("act", stage + 1, act.mb, r, (stage + 1) % p))
            else:
                held[r] -= 1
                if stage > 0:
                    sent.append(Msg("grad", stage - 1, act.mb, r, (stage - 1) % p))
        if not ran:
            raise RuntimeError(f"{kind} schedule for {p} ranks, {m} micro-batches, {v} chunks "
                               f"per rank cannot proceed at round {t}: ranks are at passes "
                               f"{[o[i] if i < len(o) else None for o, i in zip(orders, pos)]}")
        for msg in sent:
            arrived[(msg.kind, msg.stage, msg.mb)] = t
        # one order on both sides of every batch: activations before gradients, by stage, mb
        sent.sort(key=lambda msg: (msg.kind != "act", msg.stage, msg.mb))
        for r in range(p):
            sends = tuple(msg for msg in sent if msg.src == r and msg.dst != r)
            recvs = tuple(msg for msg in sent if msg.dst == r and msg.src != r)
            if r in ran or sends or recvs:
                steps[r].append(Step(t, ran.get(r), sends, recvs))
        t += 1
    return Plan(steps, peak)
