"""What every rank of a pipeline does, and when: computed the same on every rank, no messages.

A schedule is first an order of work per rank (``rank_order``): which forward (F) and backward
(B) passes, of which model chunk and micro-batch, one after another. GPipe runs every forward,
then every backward; 1F1B (PipeDream-Flush, as Megatron-LM) runs ``p - r - 1`` forwards to warm
up, then alternates one forward and one backward, then drains the backwards, so rank ``r`` never
holds more than ``p - r`` micro-batches of activations; the interleaved schedule (Megatron-LM's
virtual pipeline) does the same over ``v`` chunks per rank, a round of micro-batches per chunk
at a time (``p`` of them when ``p`` divides ``m``, as Megatron-LM; any ``m`` works, see
``interleaved_rounds``).

Why a plan and not just the order: ranks must agree on which messages travel together.
``build_plan`` plays the orders out on a clock, a forward taking one tick and a backward two
(``COST``): a rank starts its next pass once its input has come; between passes it sends what
the pass produced and takes in every message sent to it since its last look. Each message
belongs to the tick it was sent at, and a rank exchanges its messages in one batch
(``batch_isend_irecv``) per tick, in tick order: the sender's batch and the receiver's batch of
a message are the batches of the same tick (the receiver may get to it later, after a long
pass). Every rank meets the ticks in increasing order and a batch only waits for batches of
its own tick, so no rank can wait for a batch that its peer only reaches after waiting for this
one: the exchange is deadlock-free under any transport, however little it buffers
(``tests/distributed/pipelining/test_plan.py`` plays every plan out with no buffering at all).
Ranks still run at their own pace: a rank only blocks on the batches it takes part in. The
clock only decides which messages go together; with the 1:2 costs the interleaved schedule's
ranks wait less for messages they do not need yet than in lock-step.
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
    """What one rank does at tick ``tick``: exchange ``batches`` (each a ``(sends, recvs)``
    pair, one ``batch_isend_irecv`` after another), then run ``action`` (or nothing)."""

    tick: int
    batches: Tuple[Tuple[Tuple[Msg, ...], Tuple[Msg, ...]], ...]
    action: Optional[Action]

    @property
    def sends(self) -> Tuple[Msg, ...]:
        return tuple(msg for sends, _ in self.batches for msg in sends)

    @property
    def recvs(self) -> Tuple[Msg, ...]:
        return tuple(msg for _, recvs in self.batches for msg in recvs)


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
    rounds = interleaved_rounds(p, m)
    forwards: List[Action] = []
    backwards: List[Action] = []
    start = 0
    for size in rounds:  # a round of micro-batches goes through every chunk before the next
        group = range(start, start + size)
        forwards += [Action("F", c, i) for c in range(v) for i in group]
        backwards += [Action("B", c, i) for c in reversed(range(v)) for i in group]
        start += size
    total = m * v
    # Megatron-LM: with as many micro-batches as ranks there is no steady state at all. Else
    # the last rank first runs every chunk but the last on the first round (its first backward
    # needs that round's last-chunk forward), each rank before it two forwards more.
    warm = total if m == p else min((p - rank - 1) * 2 + (v - 1) * rounds[0], total)
    order = forwards[:warm]
    for k in range(total - warm):
        order += [forwards[warm + k], backwards[k]]
    return order + backwards[total - warm:]


def interleaved_rounds(p: int, m: int) -> List[int]:
    """How many micro-batches each round of the interleaved schedule sends through the chunks:
    ``max(1, m // p)`` rounds, as even as can be, the larger first (PyTorch's rounds, which
    need ``m`` divisible by their number; here a round may hold one micro-batch more).

    A round of at least ``p`` micro-batches keeps rank 0 busy until the round's first
    micro-batch comes back around the ring for the next chunk, so for ``m >= p`` the bubble is
    ``(p - 1)/(v m + p - 1)`` whether or not ``p`` divides ``m``. With ``m < p`` the one round
    is shorter than the ring and rank 0 waits (see ``interleaved_bubble``)."""
    count = max(1, m // p)
    size, larger = divmod(m, count)
    return [size + 1] * larger + [size] * (count - larger)


def interleaved_bubble(p: int, m: int, v: int) -> float:
    """The idle fraction of the interleaved schedule with equal-length chunks (whatever the
    ratio of backward to forward): ``(p - 1)/(v m + p - 1)`` for ``m >= p``; for ``m < p``
    every micro-batch crosses all ``p v`` virtual stages one after another,
    ``1 - v m / (m + p v - 1)``. Both are ``1 - v m / (v m + p - 1 + (v - 1) max(0, p - m))``.
    """
    busy = v * m
    return 1 - busy / (busy + p - 1 + (v - 1) * max(0, p - m))


class Plan(NamedTuple):
    """Every rank's steps (``steps[r]``), and how many micro-batches of activations each rank
    holds at most at once (``peak[r]``, over all its chunks)."""

    steps: List[List[Step]]
    peak: List[int]


# A backward computes the gradients of the inputs and of the weights: about twice a forward.
COST = {"F": 1, "B": 2}


def build_plan(kind: str, p: int, m: int, v: int = 1) -> Plan:
    """Play the orders out on a clock (see the module docstring); raises RuntimeError if the
    orders cannot finish, which would be a bug in ``rank_order``."""
    orders = [rank_order(kind, r, p, m, v) for r in range(p)]
    last = p * v - 1
    have = set()  # (kind, stage, mb) its consumer has received
    pos, held, peak = [0] * p, [0] * p, [0] * p
    free = [0] * p  # the tick at which each rank's running pass ends
    outbox: List[List[Msg]] = [[] for _ in range(p)]  # what the running pass will send
    pending: List[List[Tuple[int, Msg]]] = [[] for _ in range(p)]  # (tick sent, message)
    steps: List[List[Step]] = [[] for _ in range(p)]
    t = 0
    while any(pos[r] < len(orders[r]) or outbox[r] or pending[r] for r in range(p)):
        ready = [r for r in range(p) if free[r] <= t]  # ranks between passes at tick t
        sent: Dict[int, List[Msg]] = {}
        for r in ready:  # what the passes that just ended produced goes out now
            sent[r], outbox[r] = outbox[r], []
            for msg in sent[r]:
                if msg.dst == r:
                    have.add((msg.kind, msg.stage, msg.mb))  # the next chunk is on this rank
                else:
                    pending[msg.dst].append((t, msg))
        moved = any(sent.values())
        for r in ready:
            taken, pending[r] = pending[r], []
            batches = _batches([msg for msg in sent[r] if msg.dst != r], taken, t)
            have.update((msg.kind, msg.stage, msg.mb) for _, msg in taken)
            moved = moved or bool(taken)
            act = orders[r][pos[r]] if pos[r] < len(orders[r]) else None
            if act is not None:
                stage = act.chunk * p + r
                need = (None if (stage == 0 if act.kind == "F" else stage == last)
                        else ("act" if act.kind == "F" else "grad", stage, act.mb))
                if need is not None and need not in have:
                    act = None  # its input has not come yet: idle until the next tick
            if act is not None:
                pos[r] += 1
                moved = True
                free[r] = t + COST[act.kind]
                if act.kind == "F":
                    held[r] += 1
                    peak[r] = max(peak[r], held[r])
                    if stage < last:
                        outbox[r].append(Msg("act", stage + 1, act.mb, r, (stage + 1) % p))
                else:
                    held[r] -= 1
                    if stage > 0:
                        outbox[r].append(Msg("grad", stage - 1, act.mb, r, (stage - 1) % p))
            else:
                free[r] = t + 1
            if batches or act is not None:
                steps[r].append(Step(t, batches, act))
        if not moved and len(ready) == p:
            raise RuntimeError(f"{kind} schedule for {p} ranks, {m} micro-batches, {v} chunks "
                               f"per rank cannot proceed at tick {t}: ranks are at passes "
                               f"{[o[i] if i < len(o) else None for o, i in zip(orders, pos)]}")
        t += 1
    return Plan(steps, peak)


def _batches(sends: List[Msg], taken: List[Tuple[int, Msg]], t: int
             ) -> Tuple[Tuple[Tuple[Msg, ...], Tuple[Msg, ...]], ...]:
    """A rank's batches at tick ``t``: one per tick its messages were sent at, in tick order,
    each holding exactly the messages sent at that tick (its own send goes with tick ``t``).
    Both sides of a message then hold it in their batch of the same tick."""
    ticks = sorted({tick for tick, _ in taken} | ({t} if sends else set()))
    return tuple((tuple(sends) if tick == t else (),
                  tuple(sorted((msg for sent, msg in taken if sent == tick),
                               key=lambda msg: msg.src)))
                 for tick in ticks)
