"""The backward engine: iterative topological sort, then one reversed sweep.

Gradient arrays are stored without copying when they are provably exclusive. Backward closures
return either fresh arrays or (views of) the gradient they were given, so a returned array is
exclusive when it owns its memory (``base is None``), is not returned twice by the same call,
and is not the incoming gradient unless that one was exclusive. Anything else (views,
pass-through gradients, user-supplied arrays, arrays a hook has seen) is copied before a leaf
keeps it in ``.grad`` or before it is updated in place, so accumulation never aliases.

Code that runs during a backward (a hook) may ``queue_callback(fn)``: ``fn()`` runs once that
backward has processed its last node, before ``backward()`` returns (PyTorch's
``Variable._execution_engine.queue_callback``). Distributed data parallelism uses it to wait for
the gradient all-reduces its hooks started; the engine itself knows nothing about them.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Dict, List, Optional

from ..backends import backend_for


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


def queue_callback(fn: Callable[[], Any]) -> None:
    """Run ``fn()`` once the backward running on this thread has processed its last node.

    Callbacks run in the order they were queued, before ``backward()`` returns; one may queue
    another, which then runs in the same backward. If one raises, the rest are dropped and the
    exception propagates out of ``backward()``. Outside a backward this is a RuntimeError.
    """
    if not callable(fn):
        raise TypeError(f"queue_callback needs a callable, got {type(fn).__name__}")
    if not _RUNNING.stack:
        raise RuntimeError("queue_callback() can only be called while backward() runs (from a "
                           "hook); no backward is running on this thread")
    _RUNNING.stack[-1][1].append(fn)


def current_backward() -> Optional[int]:
    """A number identifying the backward running on this thread (innermost), None outside one.
    Hooks compare it with the last one they saw to tell that a new backward has begun."""
    return _RUNNING.stack[-1][0] if _RUNNING.stack else None


def topological_order(root: Any) -> List[Any]:
    """Nodes that require grad and reach ``root``, parents before children (no recursion)."""
    # Tensors hash by identity and equal hashes imply the same object, so sets and dicts
    # keyed by tensors never call Tensor.__eq__.
    order: List[Any] = []
    visited = {root}
    stack = [(root, iter(root._parents))]
    while stack:
        node, parents = stack[-1]
        for parent in parents:
            if parent.requires_grad and parent not in visited:
                visited.add(parent)
                stack.append((parent, iter(parent._parents)))
                break
        else:
            stack.pop()
            order.append(node)
    return order


def _as_gradient(value: Any, node: Any, source: str) -> Any:
    data = getattr(value, "data", value) if hasattr(value, "requires_grad") else value
    if not hasattr(data, "shape"):
        data = backend_for(node.data).asarray(data)
    if data.shape != node.data.shape:
        raise ValueError(f"{source} returned a gradient of shape {tuple(data.shape)} for a "
                         f"tensor of shape {tuple(node.data.shape)}")
    return data


def _store_leaf_grad(leaf: Any, grad: Any, owned: bool) -> None:
    backend = backend_for(leaf.data)
    if not isinstance(grad, backend.array_type):  # NumPy ops on 0-d arrays return scalars
        grad, owned = backend.asarray(grad), True
    target = leaf.data.dtype
    if grad.dtype != target:
        grad, owned = grad.astype(target), True
    if grad.shape != leaf.data.shape:
        raise RuntimeError(f"internal error: gradient of shape {grad.shape} reached a leaf of "
                           f"shape {leaf.data.shape}")
    if leaf.grad is None:
        leaf.grad = grad if owned else grad.copy()
    else:
        leaf.grad += grad


def run_backward(root: Any, seed: Any, seed_owned: bool) -> None:
    """Propagate ``seed`` (d out / d root) to every leaf that requires grad, then run the
    callbacks queued during it."""
    callbacks: List[Callable[[], Any]] = []
    stack = _RUNNING.stack
    stack.append((next(_backward_ids), callbacks))
    try:
        _sweep(root, seed, seed_owned)
        i = 0
        while i < len(callbacks):  # a callback may queue more
            callbacks[i]()
            i += 1
    finally:
        # A failure anywhere drops what is still queued: the next backward starts empty.
        stack.pop()


def _sweep(root: Any, seed: Any, seed_owned: bool) -> None:
    order = topological_order(root)
    grads: Dict[Any, Any] = {root: seed}
    owned: Dict[Any, bool] = {root: seed_owned}
    for node in reversed(order):
        grad = grads.pop(node, None)
        if grad is None:
            continue
        is_owned = owned.pop(node)
        meta = node._meta
        if meta is not None:
            hooks = meta.get("hooks")
            if hooks:
                is_owned = False  # a hook may keep a reference to the array it was shown
                for fn in list(hooks.values()):
                    replaced = fn(grad)
                    if replaced is not None:
                        grad = _as_gradient(replaced, node, "a tensor hook")
        backward = node._backward
        if backward is None:
            _store_leaf_grad(node, grad, is_owned)
            post_hooks = meta.get("post_hooks") if meta is not None else None
            if post_hooks:
                for fn in list(post_hooks.values()):
                    fn(node)
            continue
        if meta is not None and meta.get("retain"):
            kept = backend_for(node.data).asarray(grad)
            node.grad = kept.copy() if node.grad is None else node.grad + kept
        parent_grads = backward(grad)
        parents = node._parents
        repeated: Any = ()
        may_pass_through = is_owned  # the incoming array may go on to one sole recipient
        if len(parents) > 1:
            ids = [id(g) for g in parent_grads if g is not None]
            may_pass_through = is_owned and len(ids) == 1
            if len(set(ids)) != len(ids):
                repeated = ids
        for parent, pgrad in zip(parents, parent_grads):
            if pgrad is None or not parent.requires_grad:
                continue
            fresh = (pgrad.base is None and (pgrad is not grad or may_pass_through)
                     and (not repeated or id(pgrad) not in repeated))
            previous = grads.get(parent)
            if previous is None:
                grads[parent] = pgrad
                owned[parent] = fresh
            elif owned[parent] and previous.shape == pgrad.shape and previous.dtype == pgrad.dtype:
                previous += pgrad
                grads[parent] = previous  # a NumPy scalar is rebound, not updated
            else:
                grads[parent] = previous + pgrad
                owned[parent] = True
