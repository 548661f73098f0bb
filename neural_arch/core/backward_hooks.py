"""The backward engine as hooks see it: handles that unregister a hook, which backward is
running on this thread, and callbacks queued for its end.

Code that runs during a backward (a hook) may ``queue_callback(fn)``: ``fn()`` runs once that
backward has processed its last node, before ``backward()`` returns (PyTorch's
``Variable._execution_engine.queue_callback``). The engine (``autograd``) runs each backward
inside ``running_backward()``, which owns the stack of running backwards and their callbacks.
"""
from __future__ import annotations

import itertools
import threading
from contextlib import contextmanager
from typing import Any, Callable, Dict, Iterator, List, Optional


class RemovableHandle:
    """Returned by hook registration; ``remove()`` unregisters the hook."""

    __slots__ = ("_table", "_key")
    _keys = itertools.count()

    def __init__(self, table: Dict[int, Callable]) -> None:
        self._table, self._key = table, next(RemovableHandle._keys)

    def add(self, fn: Callable) -> "RemovableHandle":
        self._table[self._key] = fn
        return self

    def remove(self) -> None:
        self._table.pop(self._key, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.remove()


class _Running(threading.local):
    """The backwards running on this thread, innermost last (a hook may run a backward of its
    own): each is ``(id, callbacks queued for its end)``."""

    def __init__(self) -> None:
        self.stack: List[tuple] = []


_RUNNING = _Running()
_backward_ids = itertools.count(1)


def queue_callback(fn: Callable[[], Any], outermost: bool = False) -> None:
    """Run ``fn()`` once the backward running on this thread has processed its last node.

    Callbacks run in the order they were queued, before ``backward()`` returns; one may queue
    another, which then runs in the same backward. If one raises, the rest are dropped and the
    exception propagates out of ``backward()``. Outside a backward this is a RuntimeError.
    ``outermost``: the end of the outermost backward on this thread, not of one nested in it
    (``grad()`` run by a node's backward, as activation checkpointing's recompute does).
    """
    if not callable(fn):
        raise TypeError(f"queue_callback needs a callable, got {type(fn).__name__}")
    if not _RUNNING.stack:
        raise RuntimeError("queue_callback() can only be called while backward() runs (from a "
                           "hook); no backward is running on this thread")
    _RUNNING.stack[0 if outermost else -1][1].append(fn)


def current_backward(outermost: bool = False) -> Optional[int]:
    """A number identifying the backward running on this thread (the innermost, or with
    ``outermost`` the one the others are nested in), None outside one. Hooks compare it with
    the last one they saw to tell that a new backward has begun."""
    if not _RUNNING.stack:
        return None
    return _RUNNING.stack[0 if outermost else -1][0]


@contextmanager
def running_backward() -> Iterator[None]:
    """The body is one backward: while it runs, ``current_backward()`` names it and
    ``queue_callback`` queues for it; when it completes, the queued callbacks run."""
    callbacks: List[Callable[[], Any]] = []
    stack = _RUNNING.stack
    stack.append((next(_backward_ids), callbacks))
    try:
        yield
        i = 0
        while i < len(callbacks):  # a callback may queue more
            callbacks[i]()
            i += 1
    finally:
        # A failure anywhere drops what is still queued: the next backward starts empty.
        stack.pop()
