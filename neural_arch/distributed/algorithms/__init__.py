"""Choosing the algorithm that runs a collective.

``all_reduce`` picks, unless told otherwise: the direct shared-memory algorithm when the group
is the whole world of an shm transport; recursive doubling below ``SMALL_MESSAGE_BYTES``; the
ring above. ``algorithm=`` (per call) or the ``NEURAL_ARCH_ALLREDUCE_ALGO`` environment variable
forces one of ``ALGORITHMS["all_reduce"]``; ``"native"`` runs the transport's own collective
(MPI's ``Allreduce``). A name that cannot run on the transport raises ValueError when passed per
call; from the environment it falls back to the automatic choice, so one exported setting does
not break every backend that lacks it. The variable is read when the package is imported and
again by ``init_process_group`` (``read_environment``), not on every call: a lookup of an unset
variable costs about as much as a whole small shared-memory all-reduce.

``all_reduce`` and ``reduce_scatter`` take AVERAGE as well: the direct shared-memory
algorithms divide each round while it is still in cache, and the others sum, the mean being
taken after in one more pass over the result. ``reduce`` takes a sum, never an average: its
caller turns AVERAGE into SUM and divides after.
"""
from __future__ import annotations

import importlib
import os
from typing import Callable, Optional

import numpy as np

from ..reduce_ops import ReduceOp, divide_by_count
from ..transports.base import Fingerprint, Transport
from . import dissemination, recursive_doubling, ring, tree

ENV_ALLREDUCE_ALGO = "NEURAL_ARCH_ALLREDUCE_ALGO"
SMALL_MESSAGE_BYTES = 64 * 1024

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("auto", "ring", "recursive_doubling", "shm_direct", "native"),
    "broadcast": ("auto", "tree", "shm_direct", "native"),
    "all_gather": ("auto", "ring", "shm_direct", "native"),
    "reduce_scatter": ("auto", "ring", "shm_direct", "native"),
    "barrier": ("auto", "dissemination", "shm_direct", "native"),
}
_ALIASES = {"rd": "recursive_doubling", "recursive-doubling": "recursive_doubling",
            "direct": "shm_direct", "shm-direct": "shm_direct", "mpi": "native"}


_env_all_reduce: Optional[str] = None


def read_environment() -> None:
    """Take ``NEURAL_ARCH_ALLREDUCE_ALGO`` from the environment as it is now."""
    global _env_all_reduce
    _env_all_reduce = os.environ.get(ENV_ALLREDUCE_ALGO)


read_environment()

_UNLOADED = object()
_direct_module = _UNLOADED


def _shm_direct():
    """The direct shm module, or None when it is not part of the installation."""
    global _direct_module
    if _direct_module is _UNLOADED:
        name = f"{__name__}.shm_direct"
        try:
            _direct_module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            _direct_module = None
    return _direct_module


def _direct_ok(t: Transport) -> bool:
    module = _shm_direct()
    return module is not None and bool(module.supports_direct(t))


def normalize(collective: str, algorithm: str) -> str:
    """Canonical algorithm name; ValueError listing the choices for an unknown one."""
    choices = ALGORITHMS[collective]
    if not isinstance(algorithm, str):
        raise TypeError(f"{collective} algorithm must be a string, got {algorithm!r}")
    name = algorithm.strip().lower()
    name = _ALIASES.get(name, name.replace("-", "_"))
    if name not in choices:
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; choose one of {choices}")
    return name


def _runnable(name: str, t: Transport) -> Optional[str]:
    """Why ``name`` cannot run on ``t``, or None when it can."""
    if name == "shm_direct" and not _direct_ok(t):
        return (f"shm_direct needs the whole world of an shm transport; this group runs on "
                f"{type(t).__name__} ({t.name})")
    if name == "native" and t.native_collectives() is None:
        return f"the {t.name} transport of this group offers no native collectives"
    return None


def select(collective: str, t: Transport, nbytes: int, algorithm: Optional[str] = None) -> str:
    """The algorithm ``collective`` will use for a message of ``nbytes`` bytes on ``t``."""
    explicit = algorithm is not None
    if not explicit and collective == "all_reduce":
        algorithm = _env_all_reduce
    name = "auto" if algorithm is None else normalize(collective, algorithm or "auto")
    if t.world_size == 1:
        name = "auto"  # nothing to communicate: every algorithm gives the same result
    elif name != "auto":
        reason = _runnable(name, t)
        if reason is None:
            return name
        if explicit:
            raise ValueError(f"{collective} algorithm {name!r} cannot run here: {reason}")
    if t.world_size > 1 and _direct_ok(t):
        return "shm_direct"
    if collective == "all_reduce":
        return "recursive_doubling" if nbytes < SMALL_MESSAGE_BYTES else "ring"
    return {"broadcast": "tree", "all_gather": "ring", "reduce_scatter": "ring",
            "barrier": "dissemination"}[collective]


def _native(t: Transport):
    return t.native_collectives()


def all_reduce(t: Transport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint,
               algorithm: Optional[str] = None) -> str:
    """In-place all-reduce of a 1-D contiguous buffer (AVERAGE included); returns the
    algorithm used."""
    name = select("all_reduce", t, buf.nbytes, algorithm)
    if name == "shm_direct":
        _shm_direct().all_reduce(t, buf, op, fp)
        return name
    summed = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
    if name == "ring":
        ring.all_reduce(t, buf, summed, fp)
    elif name == "recursive_doubling":
        recursive_doubling.all_reduce(t, buf, summed, fp)
    else:
        _native(t).all_reduce(buf, summed)
    if op is ReduceOp.AVERAGE and t.world_size > 1:
        divide_by_count(buf, t.world_size)
    return name


def prepared_all_reduce(t: Transport, dtype: np.dtype, n: int,
                        op: ReduceOp) -> Optional[Callable[[np.ndarray, Fingerprint], None]]:
    """What ``all_reduce(t, buf, op, fp)`` with no algorithm named runs for a 1-D, contiguous,
    writable ``buf`` of ``n`` elements of ``dtype``, as one call ``(buf, fp)``, once an earlier
    call of that shape has prepared it; otherwise None (call ``all_reduce``). Small vectors on
    shared memory are prepared (``shm_direct``); the environment's algorithm choice turns this
    off, since it may name another algorithm."""
    views = getattr(t, "direct_views", None)
    if views is None or _env_all_reduce is not None:
        return None
    return views.get((dtype, n, op))


def broadcast(t: Transport, buf: np.ndarray, root: int, fp: Fingerprint,
              algorithm: Optional[str] = None) -> str:
    name = select("broadcast", t, buf.nbytes, algorithm)
    if name == "tree":
        tree.broadcast(t, buf, root, fp)
    elif name == "shm_direct":
        _shm_direct().broadcast(t, buf, root, fp)
    else:
        _native(t).broadcast(buf, root)
    return name


def all_gather(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint,
               algorithm: Optional[str] = None) -> str:
    name = select("all_gather", t, recvbuf.nbytes, algorithm)
    if name == "ring":
        ring.all_gather(t, sendbuf, recvbuf, fp)
    elif name == "shm_direct":
        _shm_direct().all_gather(t, sendbuf, recvbuf, fp)
    else:
        _native(t).all_gather(sendbuf, recvbuf)
    return name


def reduce_scatter(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   fp: Fingerprint, algorithm: Optional[str] = None) -> str:
    name = select("reduce_scatter", t, sendbuf.nbytes, algorithm)
    if name == "shm_direct":
        _shm_direct().reduce_scatter(t, sendbuf, recvbuf, op, fp)
        return name
    summed = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
    if name == "ring":
        ring.reduce_scatter(t, sendbuf, recvbuf, summed, fp)
    else:
        _native(t).reduce_scatter(sendbuf, recvbuf, summed)
    if op is ReduceOp.AVERAGE and t.world_size > 1:
        divide_by_count(recvbuf, t.world_size)
    return name


def barrier(t: Transport, fp: Fingerprint, algorithm: Optional[str] = None) -> str:
    name = select("barrier", t, 0, algorithm)
    if name == "dissemination":
        dissemination.barrier(t, fp)
    elif name == "shm_direct":
        _shm_direct().barrier(t, fp)
    else:
        _native(t).barrier()
    return name


reduce = tree.reduce
gather = tree.gather
scatter = tree.scatter

__all__ = ["ALGORITHMS", "ENV_ALLREDUCE_ALGO", "SMALL_MESSAGE_BYTES", "all_gather", "all_reduce",
           "barrier", "broadcast", "gather", "normalize", "read_environment", "reduce",
           "reduce_scatter", "scatter", "select"]
