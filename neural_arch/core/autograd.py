"""The backward engine: iterative topological sort, then one reversed sweep.

Gradient arrays are stored without copying when they are provably exclusive. Backward closures
return either fresh arrays or (views of) the gradient they were given, so a returned array is
exclusive when it owns its memory (``base is None``), is not returned twice by the same call,
and is not the incoming gradient unless that one was exclusive. Anything else (views,
pass-through gradients, user-supplied arrays, arrays a hook has seen) is copied before a leaf
keeps it in ``.grad`` or before it is updated in place, so accumulation never aliases.

Code that runs during a backward (a hook) may ``queue_callback(fn)``: ``fn()`` runs once that
backward has processed its last node, before ``backward()`` returns (PyTorch's
``Variable._execution_engine.queue_callback``; it lives in ``backward_hooks`` with the hook
handles and is re-exported here). Distributed data parallelism uses it to wait for the gradient
all-reduces its hooks started; the engine itself knows nothing about them.

``grad(outputs, inputs)`` (``torch.autograd.grad``) runs the same sweep but hands the gradients
that reach ``inputs`` back to the caller instead of accumulating them into any ``.grad``: code
that differentiates a graph of its own inside a backward (activation checkpointing recomputes a
block and differentiates it) returns them to the outer backward, which then accumulates them and
fires the leaves' hooks once, as if the inner graph had been part of the outer one.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..backends import backend_for
# Re-exported: hooks and the tensor methods reach these as ``autograd.queue_callback`` etc.
from .backward_hooks import RemovableHandle, current_backward, queue_callback, running_backward

__all__ = ["RemovableHandle", "current_backward", "grad", "make_seed", "queue_callback",
           "run_backward", "topological_order"]


def topological_order(*roots: Any) -> List[Any]:
    """Nodes that require grad and reach one of ``roots``, parents before children (no
    recursion)."""
    # Tensors hash by identity and equal hashes imply the same object, so sets and dicts
    # keyed by tensors never call Tensor.__eq__.
    order: List[Any] = []
    visited = set()
    for root in roots:
        if root in visited:
            continue
        visited.add(root)
        stack = [(root, iter(root._parents))]
        while stack:
            node, parents = stack[-1]
            for parent in parents:
                if parent._meta is not None and "inplace_history" in parent._meta:
                    parent = _routed(node, parent)
                if parent.requires_grad and parent not in visited:
                    visited.add(parent)
                    stack.append((parent, iter(parent._parents)))
                    break
            else:
                stack.pop()
                order.append(node)
    return order


def _routed(node: Any, parent: Any) -> Any:
    """``parent`` as ``node`` saw it: an in-place write recorded on ``parent`` after ``node``
    was made left its earlier history on a stand-in (``inplace_graph``)."""
    from .inplace_graph import route  # it imports tensor.py, which imports this module
    return route(node, parent)


def _as_gradient(value: Any, node: Any, source: str) -> Any:
    data = getattr(value, "array", value) if hasattr(value, "requires_grad") else value
    if not hasattr(data, "shape"):
        data = backend_for(node.array).asarray(data)
    if data.shape != node.array.shape:
        raise ValueError(f"{source} returned a gradient of shape {tuple(data.shape)} for a "
                         f"tensor of shape {tuple(node.array.shape)}")
    return data


def make_seed(root: Any, gradient: Any) -> Tuple[Any, bool]:
    """The array a backward from ``root`` starts with (ones for a one-element root when
    ``gradient`` is None), and whether the engine owns it (may update it in place)."""
    if gradient is None:
        if root.array.size != 1:
            raise RuntimeError("grad can be implicitly created only for scalar outputs; "
                               f"got shape {tuple(root.array.shape)}, pass gradient=")
        return backend_for(root.array).xp.ones(root.array.shape, root.array.dtype), True
    seed = gradient.array if hasattr(gradient, "requires_grad") else gradient
    seed = backend_for(root.array).asarray(seed)
    if seed.shape != root.array.shape:
        raise ValueError(f"gradient shape {tuple(seed.shape)} does not match "
                         f"tensor shape {tuple(root.array.shape)}")
    if seed.dtype != root.array.dtype:
        seed = seed.astype(root.array.dtype)
    return seed, False


def _leaf_gradient(leaf: Any, grad: Any, owned: bool) -> Tuple[Any, bool]:
    """``grad`` as an array of the leaf's backend, dtype and shape (and whether it is owned)."""
    backend = backend_for(leaf.array)
    if not isinstance(grad, backend.array_type):  # NumPy ops on 0-d arrays return scalars
        grad, owned = backend.asarray(grad), True
    target = leaf.array.dtype
    if grad.dtype != target:
        grad, owned = grad.astype(target), True
    if grad.shape != leaf.array.shape:
        raise RuntimeError(f"internal error: gradient of shape {grad.shape} reached a leaf of "
                           f"shape {leaf.array.shape}")
    return grad, owned


def _shown(grad: Any) -> Any:
    """``grad`` wrapped in a tensor (sharing it) for a hook to read."""
    from .tensor import _constant  # tensor.py imports this module first
    return _constant(grad)


def _store_leaf_grad(leaf: Any, grad: Any, owned: bool) -> None:
    grad, owned = _leaf_gradient(leaf, grad, owned)
    if leaf.grad is None:
        leaf.grad = grad if owned else grad.copy()
    else:
        leaf.grad.array += grad


def _accumulate(grads: Dict[Any, Any], owned: Dict[Any, bool], node: Any, grad: Any,
                fresh: bool) -> None:
    """Add ``grad`` to what ``node`` has received so far (in place when that one is owned)."""
    previous = grads.get(node)
    if previous is None:
        grads[node] = grad
        owned[node] = fresh
    elif owned[node] and previous.shape == grad.shape and previous.dtype == grad.dtype:
        previous += grad
        grads[node] = previous  # a NumPy scalar is rebound, not updated
    else:
        grads[node] = previous + grad
        owned[node] = True


def run_backward(root: Any, seed: Any, seed_owned: bool) -> None:
    """Propagate ``seed`` (d out / d root) to every leaf that requires grad, then run the
    callbacks queued during it."""
    _run([(root, seed, seed_owned)], None)


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None,
         allow_unused: bool = False) -> Tuple[Any, ...]:
    """``torch.autograd.grad``: the gradients of ``outputs`` with respect to ``inputs``.

    ``outputs`` and ``inputs`` are a tensor or a sequence of tensors, all requiring grad;
    ``grad_outputs`` gives d(loss)/d(output) for each output (None: ones, for one-element
    outputs). Returns one array per input, owned by the caller, or None for an input the outputs
    do not reach when ``allow_unused``. No ``.grad`` is read or written: leaves that are not in
    ``inputs`` are left alone, and the gradients of ``inputs`` are taken before their hooks run
    (those run when the caller's backward accumulates them). Hooks of the tensors in between
    run as in ``backward()``; it counts as a backward of its own for ``queue_callback``.
    """
    outputs, inputs = _tensors(outputs, "outputs"), _tensors(inputs, "inputs")
    if grad_outputs is None:
        grad_outputs = [None] * len(outputs)
    elif hasattr(grad_outputs, "requires_grad") or hasattr(grad_outputs, "shape"):
        grad_outputs = [grad_outputs]
    if len(grad_outputs) != len(outputs):
        raise ValueError(f"grad(): {len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
    for kind, tensors in (("output", outputs), ("input", inputs)):
        for i, tensor in enumerate(tensors):
            if not tensor.requires_grad:
                raise RuntimeError(f"grad(): {kind} {i} (shape {tuple(tensor.array.shape)}) does "
                                   "not require grad")
    seeds = [(out, *make_seed(out, g)) for out, g in zip(outputs, grad_outputs)]
    captured: Dict[Any, Any] = dict.fromkeys(inputs)
    _run(seeds, captured)
    result = tuple(captured[x] for x in inputs)
    if not allow_unused:
        for i, (x, g) in enumerate(zip(inputs, result)):
            if g is None:
                raise RuntimeError(f"grad(): input {i} (shape {tuple(x.array.shape)}) is not "
                                   "reached from the outputs; pass allow_unused=True to get None")
    return result


def _tensors(value: Any, what: str) -> List[Any]:
    from .tensor import Tensor  # tensor.py imports this module

    items = [value] if isinstance(value, Tensor) else value
    if not isinstance(items, (list, tuple)) or not all(isinstance(t, Tensor) for t in items):
        raise TypeError(f"grad(): {what} must be a Tensor or a sequence of Tensors, got "
                        f"{type(value).__name__}")
    return list(items)


def _run(seeds: Sequence[Tuple[Any, Any, bool]], captured: Optional[Dict[Any, Any]]) -> None:
    """One backward: the sweep, then the callbacks queued during it."""
    with running_backward():
        _sweep(seeds, captured)


def _sweep(seeds: Sequence[Tuple[Any, Any, bool]], captured: Optional[Dict[Any, Any]]) -> None:
    """Propagate the seeds through the graph. ``captured`` None: accumulate into the leaves'
    ``.grad``; else a dict whose keys are the tensors to capture the gradients of (as its
    values), and no ``.grad`` is touched."""
    order = topological_order(*(root for root, _, _ in seeds))
    grads: Dict[Any, Any] = {}
    owned: Dict[Any, bool] = {}
    for root, seed, seed_owned in seeds:
        _accumulate(grads, owned, root, seed, seed_owned)
    for node in reversed(order):
        grad = grads.pop(node, None)
        if grad is None:
            continue
        is_owned = owned.pop(node)
        if captured is not None and node in captured:
            kept, kept_owned = _leaf_gradient(node, grad, is_owned)
            captured[node] = kept if kept_owned else kept.copy()
            if kept is grad:
                is_owned = False  # the caller holds it now: never update it in place
        backward = node._backward
        if backward is None and captured is not None:
            continue  # grad() accumulates into no leaf and runs no leaf hook
        meta = node._meta
        if meta is not None:
            hooks = meta.get("hooks")
            if hooks:
                is_owned = False  # a hook may keep a reference to the array it was shown
                for fn in list(hooks.values()):
                    replaced = fn(_shown(grad))  # a tensor, as torch hands its hooks
                    if replaced is not None:
                        grad = _as_gradient(replaced, node, "a tensor hook")
        if backward is None:
            _store_leaf_grad(node, grad, is_owned)
            post_hooks = meta.get("post_hooks") if meta is not None else None
            if post_hooks:
                for fn in list(post_hooks.values()):
                    fn(node)
            continue
        if meta is not None and meta.get("retain"):
            kept = backend_for(node.array).asarray(grad)
            node.grad = kept.copy() if node.grad is None else node.grad.array + kept
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
            if pgrad is None:
                continue
            if parent._meta is not None and "inplace_history" in parent._meta:
                parent = _routed(node, parent)
            if not parent.requires_grad:
                continue
            fresh = (pgrad.base is None and (pgrad is not grad or may_pass_through)
                     and (not repeated or id(pgrad) not in repeated))
            _accumulate(grads, owned, parent, pgrad, fresh)
