"""One DDP bucket (a flat buffer of a few parameters' gradients) and what DDP measures of its
syncs: the communication waited for after backward, and the communication that ran hidden
under backward.

A sync's buckets run one after the other on the process's communication thread (the group's
queue), each as one ``Work`` that records when it started and finished; a last bucket that the
sync itself launches (explicit mode, or unused parameters) averages on the syncing thread,
which would only wait for it, and is never hidden (DDP's own average and the plain and fp16
hooks; the other hooks queue it as any bucket). The thread that ran
backward comes to the sync at some moment (the end of backward with overlap, the explicit
``sync_gradients()`` call without): what it spends from then until the averages are in place
is *waited*; the time the queue spent on this sync's buckets before that moment ran while
backward computed, and is *hidden*. Without overlap every bucket starts after the call, so
nothing is hidden.
"""
from __future__ import annotations

import time
from typing import Any, Dict, Iterator, Sequence

import numpy as np

from .wire import pack_gradient


class Bucket:
    """A flat buffer holding the gradients of a few parameters of one dtype, back to back;
    under a hook that averages a float16 copy, the flat is that copy (see ``wire``)."""

    def __init__(self, index: int, params: list, flat: np.ndarray) -> None:
        self.index = index
        self.params = params
        self.dtype = np.dtype(params[0].array.dtype) if params else flat.dtype
        sizes = [p.array.size for p in params]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self.flat = flat  # from the bucket storage: private, or this rank's shared copy
        self.ready = 0  # parameters whose gradient this backward has finished
        self.work = None  # pending async all-reduce
        self.unpacked = False  # the queue's thread unpacked this sync's average already
        self.used = np.ones(len(params), dtype=bool)

    def views(self) -> Iterator[tuple]:
        for i, p in enumerate(self.params):
            yield i, p, self.flat[self.offsets[i]:self.offsets[i + 1]]

    def pack(self) -> None:
        for i, p, view in self.views():
            if p.grad is None:
                self.used[i] = False
                view[...] = 0
            else:
                self.used[i] = True
                # GPU gradients are staged through the bucket; a float16 wire casts here
                pack_gradient(view, p.grad.array, self.dtype)

    def on_host(self) -> bool:
        """Whether every gradient is a host NumPy array (what another thread may copy)."""
        return all(type(p.array) is np.ndarray and p.grad is not None
                   and type(p.grad.array) is np.ndarray for p in self.params)


class SyncTimes:
    """Seconds of communication over all syncs: ``waited`` after backward, ``hidden`` under
    it (see the module docstring)."""

    def __init__(self) -> None:
        self.waited = self.hidden = 0.0
        self.syncs = 0

    def record(self, arrived: float, works: Sequence[Any]) -> None:
        """A sync the calling thread came to at ``arrived`` (``time.perf_counter()``) and
        finished now, its buckets having run as ``works``."""
        self.waited += time.perf_counter() - arrived
        for work in works:
            started, finished = getattr(work, "started", None), getattr(work, "finished", None)
            if started is not None and finished is not None:
                self.hidden += max(0.0, min(finished, arrived) - started)
        self.syncs += 1

    def as_dict(self) -> Dict[str, float]:
        return {"waited_s": self.waited, "hidden_s": self.hidden, "syncs": self.syncs}
