"""Starting every rank from the same state: ``broadcast_parameters``,
``broadcast_optimizer_state``, and the object collectives they rest on.

``broadcast_parameters`` writes into the storage of what it is given, in place, as Horovod's:
``model.state_dict()`` (its tensors share storage with the parameters and buffers),
``model.named_parameters()``, a dict or list of ``Tensor``s or arrays, or the model itself
(parameters and buffers).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .. import distributed as dist
from ..core import Tensor
from . import basics, negotiation, ops, rounds
from .handles import Handle


def broadcast_object(obj: Any, root_rank: int = 0, name: Any = None, process_set: Any = None):
    """Rank ``root_rank``'s ``obj`` (anything picklable) on every rank; with a ``name``,
    matched with that name on every rank (as the tensor operations are)."""
    ops._check_process_set(process_set, "broadcast_object")
    basics._layout()
    root = ops.check_root(root_rank, "broadcast_object")

    def launch():
        rnd = rounds.agree(rounds.BROADCAST_OBJECT, root=root)
        rounds.check_root_active(rnd, root, "broadcast_object")
        result = dist.broadcast_object_list([obj], src=root)[0]
        return [], lambda: result
    return Handle(negotiation.submit("broadcast_object", name, rounds.BROADCAST_OBJECT,
                                     launch)).wait()


def allgather_object(obj: Any, name: Any = None, process_set: Any = None) -> list:
    """Every rank's ``obj`` in rank order (None for ranks inside ``hvd.join()``)."""
    ops._check_process_set(process_set, "allgather_object")
    basics._layout()

    def launch():
        rounds.agree(rounds.ALLGATHER_OBJECT)
        result = dist.all_gather_object(obj)
        return [], lambda: result
    return Handle(negotiation.submit("allgather_object", name, rounds.ALLGATHER_OBJECT,
                                     launch)).wait()


def _mirror_broadcast_object(rnd: rounds.Round) -> None:
    root = rnd.fields["root"]
    rounds.check_root_active(rnd, root, "broadcast_object")
    dist.broadcast_object_list([None], src=root)


def _mirror_allgather_object(rnd: rounds.Round) -> None:
    dist.all_gather_object(None)


rounds.register_mirror(rounds.BROADCAST_OBJECT, _mirror_broadcast_object)
rounds.register_mirror(rounds.ALLGATHER_OBJECT, _mirror_allgather_object)


def _named_tensors(params: Any) -> list:
    """(name, storage array, its Tensor or None) of what ``broadcast_parameters`` was given,
    in order."""
    if hasattr(params, "named_parameters") and callable(params.named_parameters):
        pairs = list(params.named_parameters())
        if hasattr(params, "named_buffers"):
            pairs += [(f"buffer {n}", b) for n, b in params.named_buffers()]
    elif isinstance(params, dict):
        pairs = sorted(params.items(), key=lambda kv: str(kv[0]))  # the same order everywhere
    else:
        try:
            pairs = list(params)
        except TypeError:
            raise TypeError(f"hvd.broadcast_parameters needs a model, named_parameters(), or a "
                            f"dict/list of tensors, got {type(params).__name__}") from None
        pairs = [p if isinstance(p, tuple) and len(p) == 2 else (f"#{i}", p)
                 for i, p in enumerate(pairs)]
    out = []
    for name, value in pairs:
        arr = value.array if isinstance(value, Tensor) else value
        if not isinstance(arr, np.ndarray):
            raise TypeError(f"hvd.broadcast_parameters: {name!r} is a {type(value).__name__}, "
                            "not a Tensor or NumPy array")
        out.append((name, arr, value if isinstance(value, Tensor) else None))
    return out


def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite every rank's parameters, in place, with those of ``root_rank``."""
    basics._layout()
    entries = _named_tensors(params)
    handles = [ops.broadcast_async_(arr, root_rank) for _, arr, _ in entries if arr.size]
    for handle in handles:
        handle.wait()
    for _, _, tensor in entries:
        if tensor is not None:
            tensor.mark_modified_in_place()  # an in-place write, as torch counts it


def broadcast_optimizer_state(optimizer: Any, root_rank: int = 0) -> None:
    """Make every rank's optimizer state (moments, step counts, hyper-parameters) equal to
    ``root_rank``'s, whether or not a rank has stepped yet: the root's whole ``state_dict`` is
    sent and loaded, so an empty state on the root empties the others too."""
    basics._layout()
    if not (callable(getattr(optimizer, "state_dict", None))
            and callable(getattr(optimizer, "load_state_dict", None))):
        raise TypeError(f"hvd.broadcast_optimizer_state needs an optimizer with state_dict() and "
                        f"load_state_dict(), got {type(optimizer).__name__}")
    root = ops.check_root(root_rank, "broadcast_optimizer_state")
    state = optimizer.state_dict() if basics.rank() == root else None
    state = broadcast_object(state, root)
    if basics.rank() != root:
        optimizer.load_state_dict(state)
