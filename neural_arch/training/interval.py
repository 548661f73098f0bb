"""What a "train" record measures: the loss, samples and gradient communication time since the
previous record, and the rate of the steps in between.

The rate's clock starts when the run's first optimizer step ends. Everything before it (the
loader's first batch, the first forward's compilation and allocations, the transports' first
connections) is set-up, not training: counted in, it made the first interval's tokens/s a
small fraction of the next ones'. The first step's samples are therefore left out of the first
interval's rate, and its loss is kept. An interval made of the first step alone is timed from
that step's start.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, Optional

import numpy as np

from ..distributed import ReduceOp, all_reduce


class TrainInterval:
    """``strategy``: the Trainer's (its ``grad_norm``, ``comm_ms()`` and ``comm_hidden_ms()``;
    None where the communication is not timed, and the record's ``comm_seconds`` and
    ``comm_hidden_seconds`` are then null)."""

    def __init__(self, strategy: Any, clock: Callable[[], float] = time.perf_counter) -> None:
        self.strategy, self.clock = strategy, clock
        self.sums = np.zeros(3)  # loss * samples, samples, samples since the clock started
        self.first_step_start: Optional[float] = None
        self.start: Optional[float] = None  # the end of the run's first step
        self.comm_ms = self._comm_ms()
        self.hidden_ms = self._hidden_ms()
        self.flushed = 0.0

    def _comm_ms(self) -> Optional[float]:
        return self.strategy.comm_ms()

    def _hidden_ms(self) -> Optional[float]:
        hidden = getattr(self.strategy, "comm_hidden_ms", None)
        return hidden() if hidden is not None else None

    def begin_batch(self) -> None:
        """Before a micro-batch's forward: the first one starts the first step."""
        if self.first_step_start is None:
            self.first_step_start = self.clock()

    def add(self, loss: float, n: int) -> None:
        self.sums += (loss * n, n, n if self.start is not None else 0)

    def stepped(self) -> None:
        """After each optimizer step: the first one starts the rate's clock."""
        if self.start is None:
            self.start = self.clock()

    def flush(self, group: Any, tokens_per_sample: Optional[int], lr: float) -> Dict[str, Any]:
        """The record's values (the loss and samples summed over ``group``); starts the next
        interval."""
        sums = self.sums.copy()
        all_reduce(sums, ReduceOp.SUM, group=group)
        now = self.clock()
        if sums[2]:  # steps after the first one: their samples over their time
            timed, began = sums[2], self.start
        else:  # the first step alone
            timed, began = sums[1], self.first_step_start
        seconds = max(now - (now if began is None else began), 1e-9)
        comm, hidden = self._comm_ms(), self._hidden_ms()
        norm = self.strategy.grad_norm
        values = {"loss": float(sums[0] / max(sums[1], 1)), "lr": lr,
                  "grad_norm": None if norm is None else float(norm),
                  "samples_per_second": float(timed / seconds),
                  "comm_seconds": None if comm is None else (comm - self.comm_ms) / 1e3,
                  "comm_hidden_seconds": None if hidden is None
                  else (hidden - self.hidden_ms) / 1e3}
        if tokens_per_sample:
            values["tokens_per_second"] = float(timed * tokens_per_sample / seconds)
        self.flushed = float(sums[1])  # samples of all ranks in this interval
        self.sums[:] = 0
        self.start, self.comm_ms, self.hidden_ms = now, comm, hidden
        return values
