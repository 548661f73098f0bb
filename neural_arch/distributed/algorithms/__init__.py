"""Choosing the algorithm that runs a collective.

A collective runs the transport's own (``native_collectives()``) when the transport prefers
them (shared memory's direct collectives through its workspace, named ``shm_direct``);
otherwise ``all_reduce`` takes recursive doubling below ``SMALL_MESSAGE_BYTES`` and the ring
above, ``broadcast`` a tree, ``all_gather`` and ``reduce_scatter`` the ring, except that at
more than two ranks a small broadcast, all-gather or reduce-scatter runs as one
recursive-doubling all-reduce (``summed``, named ``recursive_doubling``). ``algorithm=``
(per call) or the ``NEURAL_ARCH_ALLREDUCE_ALGO`` environment variable forces one of
``ALGORITHMS["all_reduce"]``; ``"native"`` runs the transport's own collective whatever it is
(MPI's ``Allreduce``), and ``"shm_direct"`` only where that is the shared-memory one. A name
that cannot run on the transport raises ValueError when passed per call; from the environment
it falls back to the automatic choice, so one exported setting does not break every backend
that lacks it. The variable is read when the package is imported and again by
``init_process_group`` (``read_environment``), not on every call: a lookup of an unset
variable costs about as much as a whole small shared-memory all-reduce. ``init_process_group``
also compares what it means on every rank (``environment_meaning``) and raises where ranks
differ: ranks forcing different algorithms may exchange messages that look alike and end with
results whose bits differ. For the same reason what a call forces (``forced``: its
``algorithm=``, or the variable for an all-reduce without one) is part of its fingerprint, so
every rank must force the same; and a forced algorithm that runs elsewhere than the automatic
choice would first meets the others where that one runs (``_chosen``): a forced message
algorithm in shared memory's barrier, a forced ``native`` (MPI's, NCCL's) in the dissemination
barrier's messages.

``all_reduce`` and ``reduce_scatter`` take AVERAGE as well: native collectives take it as it
is (the shared-memory ones divide in the pass that adds, or as they copy out), the ring
all-reduce divides each finished piece while it is in cache, and the others sum, the mean being
taken after in one more pass over the result. ``reduce`` takes a sum, never an average: its
caller turns AVERAGE into SUM and divides after.

The rooted collectives that run on the binomial trees (``broadcast``, ``reduce``, ``gather``,
``scatter``) first make sure that every rank passed the same root (``agreement``); a native
broadcast checks that itself, and so does the summed one (every rank's root rides in the
all-reduce beside the data). At two ranks, up to ``PAIR_ROOTED_MAX_BYTES``, the root check
rides in front of the data in one exchange instead (``transports.base.pair_broadcast``,
``pair``).
"""
from __future__ import annotations

import os
from typing import Callable, Optional

import numpy as np

from ..reduce_ops import ReduceOp, divide_by_count
from ..transports.base import Fingerprint, Transport, pair_broadcast
from . import dissemination, pair, recursive_doubling, ring, summed, tree
from .agreement import agree_on_root

ENV_ALLREDUCE_ALGO = "NEURAL_ARCH_ALLREDUCE_ALGO"
SMALL_MESSAGE_BYTES = 64 * 1024

ALGORITHMS: dict[str, tuple[str, ...]] = {
    "all_reduce": ("auto", "ring", "recursive_doubling", "shm_direct", "native"),
    "broadcast": ("auto", "tree", "recursive_doubling", "shm_direct", "native"),
    "all_gather": ("auto", "ring", "recursive_doubling", "shm_direct", "native"),
    "reduce_scatter": ("auto", "ring", "recursive_doubling", "shm_direct", "native"),
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


def environment_choice() -> Optional[str]:
    """The all-reduce algorithm ``NEURAL_ARCH_ALLREDUCE_ALGO`` named when last read, or None."""
    return _env_all_reduce


def environment_meaning() -> str:
    """What the variable, as last read, names, read as ``select`` reads it: ``"auto"`` (unset,
    empty or auto), the canonical name of an algorithm (``rd`` and ``recursive-doubling``
    alike), or the text itself where it names none (every all-reduce then raises). Ranks
    whose readings differ may run different algorithms on one call; ``init_process_group``
    compares them (a name that falls back to the automatic choice on this transport still
    counts as named)."""
    raw = _env_all_reduce
    try:
        return normalize("all_reduce", raw or "auto")
    except ValueError:
        return raw


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


_NATIVE = ("native", "shm_direct")  # names that run the transport's own collectives


def _runnable(name: str, t: Transport) -> Optional[str]:
    """Why ``name`` cannot run on ``t``, or None when it can."""
    native = t.native_collectives() if name in _NATIVE else None
    if name == "shm_direct" and (native is None or native.name != "shm_direct"):
        return (f"shm_direct needs the whole world of an shm transport; this group runs on "
                f"{type(t).__name__} ({t.name})")
    if name == "native" and native is None:
        return f"the {t.name} transport of this group offers no native collectives"
    return None


def forced(collective: str, t: Optional[Transport], algorithm: Optional[str] = None
           ) -> Optional[str]:
    """The algorithm a call of ``collective`` on ``t`` forces, by its ``algorithm=`` or, for an
    all-reduce without one, through ``NEURAL_ARCH_ALLREDUCE_ALGO``; None where the choice is
    automatic (nothing forced, ``"auto"``, one rank, or a name from the environment that
    cannot run on ``t``). ValueError for a per-call name that cannot run on ``t``."""
    explicit = algorithm is not None
    if not explicit and collective == "all_reduce":
        algorithm = _env_all_reduce
    name = "auto" if algorithm is None else normalize(collective, algorithm or "auto")
    if name == "auto" or t is None or t.world_size == 1:
        return None  # one rank: nothing to communicate, every algorithm gives the same result
    reason = _runnable(name, t)
    if reason is None:
        return name
    if explicit:
        raise ValueError(f"{collective} algorithm {name!r} cannot run here: {reason}")
    return None  # from the environment: the automatic choice


def select(collective: str, t: Transport, nbytes: int, algorithm: Optional[str] = None) -> str:
    """The algorithm ``collective`` will use for a message of ``nbytes`` bytes on ``t``."""
    name = forced(collective, t, algorithm)
    if name is not None:
        return name
    if t.world_size > 1:
        native = t.native_collectives()
        if native is not None and native.preferred:
            return native.name
    if collective == "all_reduce":
        return "recursive_doubling" if nbytes < SMALL_MESSAGE_BYTES else "ring"
    if summed.takes(collective, t, nbytes):
        return "recursive_doubling"  # as one all-reduce
    return {"broadcast": "tree", "all_gather": "ring", "reduce_scatter": "ring",
            "barrier": "dissemination"}[collective]


def _chosen(collective: str, t: Transport, nbytes: int, algorithm: Optional[str],
            fp: Fingerprint) -> str:
    """``select``'s choice for a collective about to run. A forced choice (per call or through
    the environment) may run where the automatic one does not meet: shared memory's own
    collectives meet on the segment's control lines, the message-exchanging algorithms in
    their messages, MPI's and NCCL's own collectives inside those libraries. Such a call first
    meets the others where the automatic choice would, with its fingerprint, which names what
    was forced (``collectives.args.check_algorithm``): a forced message algorithm on shared
    memory in that transport's barrier, a forced ``native`` where the messages are the default
    in the dissemination barrier's messages. A rank that runs the automatic choice instead meets it
    there, and both raise the mismatch at once rather than wait, until the group's timeout, on
    channels the other never uses. The meet is one barrier per forced call, never on the
    automatic path."""
    name = select(collective, t, nbytes, algorithm)
    if t.world_size > 1:
        native = t.native_collectives()
        if native is None:
            return name  # messages only: the fingerprints meet in them
        if name in _NATIVE and not native.preferred:
            dissemination.barrier(t, _meeting(collective, fp))
        elif (name not in _NATIVE and native.preferred
              and getattr(native, "separate_channel", False)):
            native.barrier(_meeting(collective, fp))
    return name


def _meeting(collective: str, fp: Fingerprint) -> Fingerprint:
    """The fingerprint a forced call meets the others with: a broadcast's without its root, so
    that ranks passing different roots are told each rank's by the algorithm that follows."""
    return fp._replace(op=fp.op.split(":")[0]) if collective == "broadcast" else fp


def all_reduce(t: Transport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint,
               algorithm: Optional[str] = None) -> str:
    """In-place all-reduce of a 1-D contiguous buffer (AVERAGE included); returns the
    algorithm used."""
    name = _chosen("all_reduce", t, buf.nbytes, algorithm, fp)
    _run_all_reduce(name, t, buf, op, fp)
    return name


def all_reduce_plan(t: Transport, dtype: np.dtype, nbytes: int, op: ReduceOp
                    ) -> Callable[[np.ndarray, Fingerprint], None]:
    """``run(buf, fp)``: what ``all_reduce`` runs on ``t`` for every buffer of ``dtype`` and
    ``nbytes`` bytes with ``op`` and the automatic choice, chosen once. For a caller that runs
    one shape many times (the public calls' short entries): the choice depends only on these,
    the transport and the environment read at ``init_process_group``. Recursive doubling's
    own plan also takes once what its calls of the shape share."""
    name = select("all_reduce", t, nbytes)
    if name == "recursive_doubling":
        if op is ReduceOp.AVERAGE:
            return recursive_doubling.plan(t, ReduceOp.SUM, dtype, nbytes, t.world_size)
        return recursive_doubling.plan(t, op, dtype, nbytes)
    return lambda buf, fp: _run_all_reduce(name, t, buf, op, fp)


def _run_all_reduce(name: str, t: Transport, buf: np.ndarray, op: ReduceOp,
                    fp: Fingerprint) -> None:
    if name in _NATIVE:
        t.native_collectives().all_reduce(buf, op, fp)
        return
    folded = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
    if name == "ring":  # divides each finished piece while it is in cache
        ring.all_reduce(t, buf, folded, fp, t.world_size if op is ReduceOp.AVERAGE else 0)
        return
    recursive_doubling.all_reduce(t, buf, folded, fp)
    if op is ReduceOp.AVERAGE and t.world_size > 1:
        divide_by_count(buf, t.world_size)


def broadcast(t: Transport, buf: np.ndarray, root: int, fp: Fingerprint,
              algorithm: Optional[str] = None) -> str:
    name = _chosen("broadcast", t, buf.nbytes, algorithm, fp)
    if name in _NATIVE:
        t.native_collectives().broadcast(buf, root, fp)  # checks the root itself
    elif name == "recursive_doubling":
        summed.broadcast(t, buf, root, fp)  # checks the root itself
    elif not pair_broadcast(t, buf, root, fp):
        agree_on_root(t, root, fp)
        tree.broadcast(t, buf, root, fp)
    return name


def broadcast_plan(t: Transport, dtype: np.dtype, count: int, root: int
                   ) -> Callable[[np.ndarray, Fingerprint], None]:
    """``run(buf, fp)``: ``broadcast`` from ``root`` of every buffer of ``count`` elements of
    ``dtype`` with the automatic choice, chosen once (for the public call's short entry; the
    root already checked to be in the group)."""
    nbytes = count * np.dtype(dtype).itemsize
    if select("broadcast", t, nbytes) == "recursive_doubling":
        return summed.broadcast_plan(t, nbytes, root)
    return lambda buf, fp: broadcast(t, buf, root, fp)


def all_gather_plan(t: Transport, dtype: np.dtype, count: int
                    ) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """``run(sendbuf, recvbuf, fp)``: what ``all_gather`` runs on ``t`` for every ``sendbuf``
    of ``count`` elements of ``dtype`` (``recvbuf``: world size times as many, checked by the
    caller) with the automatic choice, chosen once, for a caller that runs one shape many
    times (the public call's short entry)."""
    itemsize = np.dtype(dtype).itemsize
    name = select("all_gather", t, count * t.world_size * itemsize)
    if name in _NATIVE:
        return t.native_collectives().all_gather
    if name == "recursive_doubling":
        return summed.all_gather_plan(t, count, itemsize)
    return ring.all_gather_plan(t, count, itemsize)


def all_gather(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint,
               algorithm: Optional[str] = None) -> str:
    name = _chosen("all_gather", t, recvbuf.nbytes, algorithm, fp)
    if name in _NATIVE:
        t.native_collectives().all_gather(sendbuf, recvbuf, fp)
    elif name == "recursive_doubling":
        summed.all_gather(t, sendbuf, recvbuf, fp)
    else:
        ring.all_gather(t, sendbuf, recvbuf, fp)
    return name


def reduce_scatter(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   fp: Fingerprint, algorithm: Optional[str] = None) -> str:
    name = _chosen("reduce_scatter", t, sendbuf.nbytes, algorithm, fp)
    if name in _NATIVE:
        t.native_collectives().reduce_scatter(sendbuf, recvbuf, op, fp)
        return name
    if name == "recursive_doubling":
        summed.reduce_scatter(t, sendbuf, recvbuf, op, fp)
        return name
    ring.reduce_scatter(t, sendbuf, recvbuf, ReduceOp.SUM if op is ReduceOp.AVERAGE else op,
                        fp)
    if op is ReduceOp.AVERAGE and t.world_size > 1:
        divide_by_count(recvbuf, t.world_size)
    return name


def reduce_scatter_plan(t: Transport, dtype: np.dtype, count: int, op: ReduceOp
                        ) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """``run(sendbuf, recvbuf, fp)``: ``reduce_scatter`` of every input of ``count`` elements
    of ``dtype`` with ``op`` and the automatic choice, chosen once (the short entry's)."""
    if select("reduce_scatter", t, count * np.dtype(dtype).itemsize) == "recursive_doubling":
        return summed.reduce_scatter_plan(t, dtype, count, op)
    return lambda sendbuf, recvbuf, fp: reduce_scatter(t, sendbuf, recvbuf, op, fp)


def barrier(t: Transport, fp: Fingerprint, algorithm: Optional[str] = None) -> str:
    name = _chosen("barrier", t, 0, algorithm, fp)
    if name in _NATIVE:
        t.native_collectives().barrier(fp)
    else:
        dissemination.barrier(t, fp)
    return name


def reduce(t: Transport, buf: np.ndarray, root: int, op: ReduceOp, fp: Fingerprint) -> None:
    if not pair.reduce(t, buf, root, op, fp):
        agree_on_root(t, root, fp)
        tree.reduce(t, buf, root, op, fp)


def gather(t: Transport, sendbuf: np.ndarray, recvbuf: Optional[np.ndarray], root: int,
           fp: Fingerprint) -> None:
    if not pair.gather(t, sendbuf, recvbuf, root, fp):
        agree_on_root(t, root, fp)
        tree.gather(t, sendbuf, recvbuf, root, fp)


def scatter(t: Transport, sendbuf: Optional[np.ndarray], recvbuf: np.ndarray, root: int,
            fp: Fingerprint) -> None:
    if not pair.scatter(t, sendbuf, recvbuf, root, fp):
        agree_on_root(t, root, fp)
        tree.scatter(t, sendbuf, recvbuf, root, fp)


__all__ = ["ALGORITHMS", "ENV_ALLREDUCE_ALGO", "SMALL_MESSAGE_BYTES", "agree_on_root",
           "all_gather", "all_gather_plan", "all_reduce", "all_reduce_plan", "barrier",
           "broadcast", "broadcast_plan", "environment_choice", "environment_meaning", "gather",
           "normalize", "read_environment", "reduce", "reduce_scatter", "reduce_scatter_plan",
           "scatter", "select"]
