"""Stop training cleanly when the job is asked to stop (SIGTERM from a scheduler, Ctrl-C).

The signal handler only records that a signal came; the training loop looks at the record at
its step boundaries, where the state is consistent. ``should_stop()`` combines the records of
all ranks (an all-reduce of the flag with MAX), so when any rank was signalled every rank
stops after the same step, saves one checkpoint together and exits::

    with PreemptionHandler() as preemption:
        state = setup_fault_tolerant_training(model, optimizer, manager)
        for step in range(state["start_step"], total_steps):
            train_step(step)
            if preemption.should_stop():      # every rank calls it, at every step
                manager.save_checkpoint(model, optimizer, epoch, step, loss)
                break                          # then leave with exit status 0
    destroy_process_group()

A relaunch resumes from that checkpoint. The launcher forwards SIGTERM to every worker and
kills them after its grace period (5 s), so one step plus one save must fit in that time.
"""
from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Dict, Iterable, Optional

import numpy as np

__all__ = ["PreemptionHandler", "any_rank_requested"]


def any_rank_requested(requested: bool, group: Any = None) -> bool:
    """True on every rank when ``requested`` is true on at least one rank of ``group``.

    A collective when a process group is initialized: all ranks must call it at the same
    point. Without one it returns ``requested``.
    """
    from ..group.world import is_initialized
    if not is_initialized():
        return bool(requested)
    from ..collectives import all_reduce
    from ..reduce_ops import ReduceOp
    flag = np.array([1 if requested else 0], dtype=np.int32)
    all_reduce(flag, ReduceOp.MAX, group=group)
    return bool(flag[0])


class PreemptionHandler:
    """Context manager that turns ``signals`` into a flag instead of stopping the process.

    The previous handlers come back on exit. Handlers can only be installed from the main
    thread, as Python requires. While installed, Ctrl-C raises no KeyboardInterrupt: a loop
    that never reaches ``should_stop`` is ended by SIGKILL or the process group's timeout.
    """

    def __init__(self, signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT)) -> None:
        self.signals = tuple(signal.Signals(s) for s in signals)
        if not self.signals:
            raise ValueError("PreemptionHandler needs at least one signal")
        self._requested = False
        self._received: Optional[int] = None
        self._previous: Optional[Dict[int, Any]] = None

    def _record(self, signum: int, _frame: Optional[FrameType]) -> None:
        # Only plain assignments: the handler may interrupt the loop at any bytecode.
        self._received = signum
        self._requested = True

    def __enter__(self) -> "PreemptionHandler":
        if self._previous is not None:
            raise RuntimeError("this PreemptionHandler is already installed")
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(f"signal handlers can only be installed from the main thread, "
                               f"not {threading.current_thread().name!r}")
        previous: Dict[int, Any] = {}
        try:
            for sig in self.signals:
                previous[sig] = signal.signal(sig, self._record)
        except BaseException:
            self._restore(previous)
            raise
        self._previous = previous
        return self

    def __exit__(self, *exc_info: Any) -> None:
        previous, self._previous = self._previous, None
        if previous is not None:
            self._restore(previous)

    @staticmethod
    def _restore(previous: Dict[int, Any]) -> None:
        for sig, handler in previous.items():
            # None means a handler installed outside Python; the default is the closest match.
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)

    @property
    def requested(self) -> bool:
        """Whether one of the signals arrived (on this rank) since the handler was created."""
        return self._requested

    @property
    def received_signal(self) -> Optional[signal.Signals]:
        """The last signal received, or None."""
        return None if self._received is None else signal.Signals(self._received)

    def request(self) -> None:
        """Ask for a stop as a signal would (from code, e.g. on a wall-clock budget)."""
        self._requested = True

    def should_stop(self, group: Any = None) -> bool:
        """True on every rank of ``group`` when any of them was asked to stop; collective."""
        return any_rank_requested(self._requested, group)
