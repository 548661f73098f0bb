"""Named operations, matched by name on every rank as Horovod's coordinator matches them.

An operation without a name (None or "") starts at once, so ranks must call those in the same
order. One with a name (``hvd.allreduce_async(x, name="a")``) is queued on its rank instead,
and starts only once every rank has submitted that name, whatever the order of submission:

- Waiting for a queued operation (``synchronize``, ``poll``, a synchronous named call) runs
  a *negotiation*: an agreement round of its own kind, then an object all-gather of every
  rank's queued names. Ranks inside ``hvd.join()`` answer it too, and count as having every
  name (they contribute nothing, or their own data for a name they queued before joining).
- The names queued on every training rank start in one order, the order of the lowest such
  rank's submissions; each runs its own agreement round and collective, as unnamed ones do.
- A name queued on some training ranks but not on others waits for the next negotiation.
  Once it has waited ``HOROVOD_STALL_SHUTDOWN_TIME_SECONDS`` (60 s by default) on any rank,
  every rank raises a ``RuntimeError`` naming it, the ranks that submitted it and those that
  did not, and drops it.
- A name already queued on this rank cannot be submitted again until it has started.

A negotiation is a collective: every rank must be waiting for named operations (or be inside
``join()``) at that point; a rank that runs an unnamed operation meanwhile makes every rank
raise "ranks disagree on the kind", naming who ran what.
"""
from __future__ import annotations

import contextlib
import os
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from .. import distributed as dist
from . import basics, rounds

STALL_ENV = "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"
DEFAULT_STALL_S = 60.0
_IDLE_SLEEP_S = (0.001, 0.02)  # between negotiations that started nothing: first, longest

Launch = Callable[[], Tuple[List[Any], Callable[[], Any]]]


class Operation:
    """One collective of this rank; ``launch()`` starts it and gives (works, finish) where
    ``finish()`` waits and returns the result."""

    def __init__(self, what: str, name: Optional[str], kind: int, launch: Launch) -> None:
        self.what, self.name, self._launch = what, name, launch
        self.kind = rounds.KIND_NAMES[kind]  # ranks may match allreduce_async with allreduce_
        self.works: List[Any] = []
        self.finish: Optional[Callable[[], Any]] = None
        self.error: Optional[str] = None  # set when it failed before it could start

    @property
    def started(self) -> bool:
        return self.finish is not None

    def start(self) -> None:
        self.works, self.finish = self._launch()

    def result(self) -> Any:
        """Wait for the started operation; an agreement round's error names the operation."""
        try:
            return self.finish()
        except Exception as exc:
            if self.name is None or type(exc) is not RuntimeError:
                raise
            raise RuntimeError(self.named(exc)) from exc

    def named(self, exc: Exception) -> str:
        text = str(exc) if type(exc) is RuntimeError else f"{type(exc).__name__}: {exc}"
        return f"hvd.{self.what}(name={self.name!r}): {text}"


class _Queue:
    """This rank's named operations not started yet, in submission order."""

    def __init__(self, layout: Any) -> None:
        self.layout = layout
        self.pending: List[Operation] = []
        self.waiting_since: Dict[str, float] = {}  # names not on every training rank yet

    def take(self, name: str) -> Optional[Operation]:
        for i, op in enumerate(self.pending):
            if op.name == name:
                return self.pending.pop(i)
        return None


_QUEUE: Optional[_Queue] = None


def _queue() -> _Queue:
    """The queue of this ``hvd.init()`` (a shutdown forgets what was queued)."""
    global _QUEUE
    layout = basics._layout()
    if _QUEUE is None or _QUEUE.layout is not layout:
        _QUEUE = _Queue(layout)
    return _QUEUE


def stall_timeout() -> float:
    raw = os.environ.get(STALL_ENV, "").strip()
    if not raw:
        return DEFAULT_STALL_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise ValueError(f"{STALL_ENV}={raw!r}: the seconds a named Horovod operation may wait "
                         "for the other ranks must be a number > 0")
    return value


def submit(what: str, name: Any, kind: int, launch: Launch) -> Operation:
    """Start an unnamed operation now, or queue a named one until every rank has its name."""
    if name is None or name == "":
        op = Operation(what, None, kind, launch)
        op.start()
        return op
    if not isinstance(name, str):
        raise TypeError(f"hvd.{what}: name must be a str, got {type(name).__name__} {name!r}")
    queue = _queue()
    stall_timeout()  # a bad setting fails here, not halfway through a negotiation
    if any(op.name == name for op in queue.pending):
        raise ValueError(f"hvd.{what}(name={name!r}): an operation named {name!r} is already "
                         f"pending on rank {basics.rank()}; a name may be submitted again only "
                         "once the operation under it has started (wait for its handle)")
    op = Operation(what, name, kind, launch)
    queue.pending.append(op)
    return op


def negotiate() -> bool:
    """One negotiation; True when it started an operation of this rank."""
    queue, limit = _queue(), stall_timeout()
    rnd = rounds.agree(rounds.NEGOTIATE, value=len(queue.pending))
    return _settle(queue, rnd, limit, joined=False)


def wait_started(op: Operation) -> None:
    """Negotiate until ``op`` has started (or failed: its error is raised)."""
    idle = 0
    while not op.started and op.error is None:
        if negotiate() or op.started or op.error is not None:
            idle = 0
            continue
        time.sleep(min(_IDLE_SLEEP_S[0] * 2 ** idle, _IDLE_SLEEP_S[1]))
        idle += 1
    if op.error is not None:
        raise RuntimeError(op.error)


def _answer_negotiation(rnd: rounds.Round) -> None:
    """A joined rank's part in a negotiation of the training ranks."""
    try:
        limit = stall_timeout()
    except ValueError:  # the training ranks' setting decides; this rank's must not stop it
        limit = DEFAULT_STALL_S
    _settle(_queue(), rnd, limit, joined=True)


def _ranks(ranks: List[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {ranks}"


def _settle(queue: _Queue, rnd: rounds.Round, limit: float, joined: bool) -> bool:
    """Exchange the queued names, then raise for those stalled too long or start those that
    every training rank has; every rank decides alike from the same gathered lists."""
    now = time.monotonic()
    stalled_here = [n for n, since in queue.waiting_since.items() if now - since >= limit]
    everyone = dist.all_gather_object(
        {"pending": [(op.name, op.kind) for op in queue.pending], "stalled": stalled_here})
    match = _Match(everyone, rnd.active_ranks)
    queue.waiting_since = {n: queue.waiting_since.get(n, now) for n in match.waiting}
    stalled = [n for n in match.waiting if any(n in m["stalled"] for m in everyone)]
    if stalled:
        _fail(queue, stalled, match.stall_error(stalled, limit))
    odd = [n for n in match.ready if len(set(match.kinds[n].values())) > 1]
    if odd:
        _fail(queue, odd, match.kind_error(odd))
    started = False
    for name in match.ready:
        op = queue.take(name)
        if op is None:  # a joined rank without this name: its round, answered empty
            rounds.answer_round()
            continue
        try:
            with rounds.contributing() if joined else contextlib.nullcontext():
                op.start()
        except Exception as exc:
            op.error = op.named(exc)
            if type(exc) is not RuntimeError:  # a transport's error keeps its type
                raise
            raise RuntimeError(op.error) from exc
        started = True
    return started


class _Match:
    """Who queued which name, from every rank's list: ``ready`` (queued on every training
    rank, in the lowest one's submission order) and ``waiting`` (queued on some only)."""

    def __init__(self, everyone: List[dict], training: List[int]) -> None:
        self.training = training
        self.submitters: Dict[str, List[int]] = {}  # training ranks that queued the name
        self.kinds: Dict[str, Dict[int, str]] = {}  # rank -> kind, joined ranks included
        for r, message in enumerate(everyone):
            for name, kind in message["pending"]:
                self.kinds.setdefault(name, {})[r] = kind
                if r in training:
                    self.submitters.setdefault(name, []).append(r)
        self.ready = [name for name, _ in everyone[training[0]]["pending"]
                      if len(self.submitters[name]) == len(training)]
        self.waiting = [name for name in self.submitters if name not in self.ready]

    def stall_error(self, names: List[str], limit: float) -> str:
        parts = [f"{n!r} ({'/'.join(sorted(set(self.kinds[n].values())))}) submitted by "
                 f"{_ranks(self.submitters[n])}, missing on "
                 f"{_ranks([r for r in self.training if r not in self.submitters[n]])}"
                 for n in names]
        return (f"Horovod named operations not submitted on every rank within {limit:g} s "
                f"({STALL_ENV}): {'; '.join(parts)}. Every rank must submit every name")

    def kind_error(self, names: List[str]) -> str:
        parts = [f"{n!r}: " + ", ".join(f"rank {r} {k}" for r, k in sorted(self.kinds[n].items()))
                 for n in names]
        return "ranks submitted different Horovod operations under one name: " + "; ".join(parts)


def _fail(queue: _Queue, names: List[str], message: str) -> None:
    """Drop ``names`` from the queue and raise ``message`` (as their handles will)."""
    for name in names:
        op = queue.take(name)
        if op is not None:
            op.error = message
        queue.waiting_since.pop(name, None)
    raise RuntimeError(message)


rounds.register_mirror(rounds.NEGOTIATE, _answer_negotiation)
