"""What the ``_async`` operations return, and ``synchronize``/``poll`` on it.

A handle of a named operation may not have started yet (``negotiation``): waiting for it, or
polling it, negotiates with the other ranks until every rank has submitted its name.
"""
from __future__ import annotations

from typing import Any

from . import negotiation


class Handle:
    """What the ``_async`` operations return: pass it to ``hvd.synchronize`` or ``hvd.poll``."""

    def __init__(self, op: negotiation.Operation) -> None:
        self.what, self._op = op.what, op
        self._synchronized = False

    def poll(self) -> bool:
        """True once the operation has finished; a named one not started yet takes part in
        one negotiation first (a collective, like the other ranks' waits)."""
        op = self._op
        if not op.started and op.error is None:
            negotiation.negotiate()
        if op.error is not None:
            return True  # finished, with an error that synchronize() raises
        return op.started and all(w.is_completed() for w in op.works)

    def wait(self) -> Any:
        if self._synchronized:
            raise ValueError(f"hvd.synchronize: the handle of this {self.what} was already "
                             "synchronized; its result was returned then")
        self._synchronized = True
        negotiation.wait_started(self._op)
        return self._op.result()

    def __repr__(self) -> str:
        op = self._op
        state = ("synchronized" if self._synchronized else "failed" if op.error
                 else "queued" if not op.started else "done" if self.poll() else "pending")
        name = f", {op.name!r}" if op.name else ""
        return f"Handle({self.what}{name}, {state})"


def synchronize(handle: Handle) -> Any:
    """Wait for an async operation and return its result (the tensor, for the ``_`` forms)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"hvd.synchronize needs a handle from an hvd.*_async call, got "
                        f"{type(handle).__name__}")
    return handle.wait()


def poll(handle: Handle) -> bool:
    """True once the async operation has finished (``synchronize`` will not wait)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"hvd.poll needs a handle from an hvd.*_async call, got "
                        f"{type(handle).__name__}")
    return handle.poll()
