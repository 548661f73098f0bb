"""Recording an in-place op in the graph, as torch does for a tensor that is not a leaf
requiring grad (``y = x * 2; y.add_(1)``; ``buf = zeros(3); buf.add_(w)``).

Here the Tensor object is its own graph node, and ops made before the in-place write hold it as
their parent. ``rebase`` therefore moves the tensor's history onto a stand-in (``old``), gives
the tensor the history of the out-of-place result, and notes on the tensor when that happened
(every recorded node carries a creation number, ``_seq``). The engine asks ``route`` for each
parent it reaches: a consumer made before the write is sent to the stand-in, so its gradient
skips the in-place op, one made after to the tensor, exactly as torch's grad_fn rewriting.
"""
from __future__ import annotations

from typing import Any

from .tensor import Tensor, next_node_number


def stand_in(tensor: Tensor, keep_values: bool) -> Tensor:
    """A tensor with ``tensor``'s history and values, for the out-of-place op to read.
    ``keep_values``: the op's backward reads the values, so they are copied before the write
    (else the stand-in shares the array and its version counter)."""
    old = Tensor.__new__(Tensor)
    old.array = tensor.array.copy() if keep_values else tensor.array
    old._vc = [0] if keep_values else tensor._vc
    old.grad = None
    old.requires_grad = tensor.requires_grad
    old._parents = tensor._parents
    old._backward = tensor._backward
    old._meta = None
    old._seq = getattr(tensor, "_seq", 0)
    return old


def rebase(tensor: Tensor, old: Tensor, result: Tensor) -> None:
    """``tensor`` now stands for ``result`` (computed from ``old``); earlier consumers of
    ``tensor`` keep reaching ``old`` through ``route``."""
    if result.requires_grad:
        history = tensor._get_meta().setdefault("inplace_history", [])
        history.append((next_node_number(), old))
        tensor._parents = result._parents
        tensor._backward = result._backward
        tensor._seq = result._seq
        tensor.requires_grad = True


def route(node: Any, parent: Any) -> Any:
    """The tensor that ``node``'s gradient for ``parent`` belongs to: ``parent``, or the
    stand-in for what ``parent`` was when ``node`` was made."""
    history = parent._meta.get("inplace_history")
    if history:
        made = node._seq
        for rebased_at, old in history:  # oldest first
            if made < rebased_at:
                return old
    return parent
