"""Activation checkpointing (``torch.utils.checkpoint``): spend compute to save memory.

Backward needs what the forward computed: every op keeps its inputs (activations) for it. A
model of L blocks therefore holds L blocks' worth of activations from the forward until backward
reaches each block, and for a deep or wide model they dominate the memory of a training step.
``checkpoint(block, x)`` runs the block without recording the graph and keeps only its inputs;
when backward reaches the block's output, the block runs again, this time recording, and that
graph is differentiated at once and dropped. The peak then holds the inputs of every block plus
the activations of one, for one more forward of each checkpointed block per step.

How it meets the engine: the output is one node whose parents are the tensor inputs that
require grad and the leaves the function reads (its parameters). That node's backward recomputes
and asks ``autograd.grad`` for the gradients of both, and returns them: the outer backward
accumulates them into the parameters' ``.grad`` and fires their hooks inside itself, as without
checkpointing (DistributedDataParallel's hooks follow the backward they run in).

Finding the leaves: for a ``Module``, or a bound method of one, they are its parameters, known
without running anything, so the forward runs under ``no_grad``. Any other callable may read
tensors nothing names (closures, globals, ``functools.partial``): its forward runs once with
grad enabled on detached inputs, and only the leaves its graph reaches are kept; the graph goes
as soon as the call returns. Its activations live during that call only, as they do during the
recompute, so the peak is the same and no extra forward runs. If the recomputed graph reaches a
leaf that requires grad and is not one of those (a tensor a module reads without owning it),
backward raises instead of leaving that tensor without its gradient.

Randomness: with ``preserve_rng_state`` the recompute replays the forward's draws (dropout masks
are equal) on the generator that made them, then puts the global generator and its state back,
so the random stream after backward is the one of a run without checkpointing. All of the
framework's randomness, dropout on either backend included, is drawn from that NumPy generator
(``core.random``); CuPy's own generator is never drawn from, so there is nothing of it to replay.

Tensors are looked for among the arguments themselves, not inside lists or dicts: pass each
tensor that needs a gradient as an argument of its own. The function runs twice per step, so
its side effects (a counter, a list it appends to) happen twice, as in torch.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from ..core import autograd
from ..core.dtypes import is_floating
from ..core.grad_mode import enable_grad, is_grad_enabled, no_grad
from ..core.random import get_rng, set_rng
from ..core.tensor import Tensor, make_result
from ..nn.module import Module

__all__ = ["checkpoint"]


def checkpoint(function: Callable[..., Any], *args: Any, use_reentrant: Optional[bool] = None,
               preserve_rng_state: bool = True, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, its activations recomputed during backward instead of kept.

    ``function`` returns a Tensor or a tuple of them (other items pass through, as do non-tensor
    arguments). Under ``no_grad`` it simply runs. ``use_reentrant`` is accepted for torch's
    signature; both of torch's variants behave here as the non-reentrant one (gradients reach the
    parameters even when no input requires grad, keyword arguments are allowed).
    """
    if use_reentrant is not None and not isinstance(use_reentrant, bool):
        raise TypeError(f"checkpoint: use_reentrant must be None or a bool, got {use_reentrant!r}")
    if not callable(function):
        raise TypeError(f"checkpoint: function must be callable, got {type(function).__name__}")
    if not is_grad_enabled():
        return function(*args, **kwargs)
    _reject_nested_tensors(args, kwargs)
    generator = get_rng()
    state = generator.bit_generator.state if preserve_rng_state else None
    inputs = _unique(t for t in _tensor_arguments(args, kwargs) if t.requires_grad)
    owner = _owning_module(function)
    if owner is not None:
        with no_grad():
            result = function(*args, **kwargs)
        leaves = [p for p in owner.parameters() if p.requires_grad]
    else:
        result, leaves = _probe(function, args, kwargs, inputs)
    taken = set(inputs)
    leaves = [leaf for leaf in _unique(leaves) if leaf not in taken]
    outputs = _differentiable_outputs(function, result)
    if not (inputs or leaves) or not outputs:
        return result  # nothing to differentiate: the outputs are constants already
    recompute = _Recompute(function, args, kwargs, inputs, leaves, generator, state)
    parents = tuple(inputs) + tuple(leaves)
    if isinstance(result, Tensor):
        return make_result(result.array, parents, lambda grad: recompute.backward([grad]))
    return _tuple_of_nodes(result, outputs, parents, recompute)


class _Recompute:
    """What a checkpoint keeps from its forward, and its backward."""

    def __init__(self, function: Callable[..., Any], args: tuple, kwargs: dict,
                 inputs: List[Tensor], leaves: List[Tensor], generator: np.random.Generator,
                 state: Optional[dict]) -> None:
        self.function, self.args, self.kwargs = function, args, kwargs
        self.inputs, self.leaves = inputs, leaves
        self.generator, self.state = generator, state

    def backward(self, grad_outputs: Sequence[Any]) -> Tuple[Any, ...]:
        """The gradients of the parents (inputs, then leaves), given those of the outputs that
        are differentiable (None for one that received none)."""
        copies = {x: x.detach().requires_grad_() for x in self.inputs}
        with _replayed_rng(self.generator, self.state), enable_grad():
            args = tuple(copies.get(a, a) if isinstance(a, Tensor) else a for a in self.args)
            kwargs = {k: copies.get(v, v) if isinstance(v, Tensor) else v
                      for k, v in self.kwargs.items()}
            result = self.function(*args, **kwargs)
        outputs = [out for _, out in _differentiable_outputs(self.function, result)]
        if len(outputs) != len(grad_outputs):
            raise RuntimeError(f"checkpoint: {_name(self.function)} returned {len(outputs)} "
                               f"differentiable outputs when recomputed, {len(grad_outputs)} in "
                               "the forward")
        roots = [(out, g) for out, g in zip(outputs, grad_outputs)
                 if g is not None and out.requires_grad]
        targets = [copies[x] for x in self.inputs] + self.leaves
        if not roots:
            return (None,) * len(targets)
        self._check_leaves([out for out, _ in roots], targets)
        return autograd.grad([out for out, _ in roots], targets, [g for _, g in roots],
                             allow_unused=True)

    def _check_leaves(self, roots: List[Tensor], targets: List[Tensor]) -> None:
        known = set(targets)
        for node in autograd.topological_order(*roots):
            if node.is_leaf and node not in known:
                raise RuntimeError(
                    f"checkpoint: {_name(self.function)} used a tensor of shape "
                    f"{tuple(node.array.shape)} that requires grad but is neither one of its "
                    "arguments nor one of its parameters, so its gradient would be lost; pass it "
                    "as an argument")


def _tuple_of_nodes(result: tuple, outputs: List[Tuple[int, Tensor]], parents: tuple,
                    recompute: _Recompute) -> tuple:
    """Outputs of a function that returned several tensors. Each is a node whose one parent is
    a shared (empty) node: each output's backward only files its gradient, and the shared node,
    which the engine reaches after all of them, recomputes once for all."""
    pending: Dict[int, Any] = {}
    empty = np.zeros(0, dtype=outputs[0][1].array.dtype)

    def joint_backward(_: Any) -> Tuple[Any, ...]:
        try:
            return recompute.backward([pending.get(i) for i in range(len(outputs))])
        finally:
            pending.clear()

    joint = make_result(empty, parents, joint_backward)

    def filing(i: int) -> Callable[[Any], Tuple[Any]]:
        def backward(grad: Any) -> Tuple[Any]:
            pending[i] = grad
            return (np.zeros(0, dtype=empty.dtype),)
        return backward

    items = list(result)
    for i, (position, out) in enumerate(outputs):
        items[position] = make_result(out.array, (joint,), filing(i))
    return tuple(items)


def _probe(function: Callable[..., Any], args: tuple, kwargs: dict, inputs: List[Tensor]
           ) -> Tuple[Any, List[Tensor]]:
    """Run a callable whose parameters are unknown with grad enabled, on detached inputs, and
    return its result and the leaves requiring grad that its graph reaches (see the module
    docstring). The returned tensors still carry that graph; the caller keeps only their data."""
    copies = {x: x.detach().requires_grad_() for x in inputs}
    args = tuple(copies.get(a, a) if isinstance(a, Tensor) else a for a in args)
    kwargs = {k: copies.get(v, v) if isinstance(v, Tensor) else v for k, v in kwargs.items()}
    result = function(*args, **kwargs)
    roots = [out for _, out in _differentiable_outputs(function, result) if out.requires_grad]
    stand_ins = set(copies.values())
    leaves = [node for node in autograd.topological_order(*roots)
              if node.is_leaf and node not in stand_ins]
    return result, leaves


def _differentiable_outputs(function: Callable[..., Any], result: Any
                            ) -> List[Tuple[int, Tensor]]:
    """(position, tensor) of the floating-point tensors ``function`` returned."""
    if isinstance(result, Tensor):
        items: Sequence[Any] = (result,)
    elif isinstance(result, tuple):
        items = result
    else:
        raise TypeError(f"checkpoint: {_name(function)} returned {type(result).__name__}; "
                        "expected a Tensor or a tuple of Tensors")
    return [(i, t) for i, t in enumerate(items)
            if isinstance(t, Tensor) and is_floating(t.array.dtype)]


def _owning_module(function: Callable[..., Any]) -> Optional[Module]:
    if isinstance(function, Module):
        return function
    owner = getattr(function, "__self__", None)
    return owner if isinstance(owner, Module) else None


def _tensor_arguments(args: tuple, kwargs: dict) -> Iterator[Tensor]:
    for value in (*args, *kwargs.values()):
        if isinstance(value, Tensor):
            yield value


def _reject_nested_tensors(args: tuple, kwargs: dict) -> None:
    for value in (*args, *kwargs.values()):
        items = value.values() if isinstance(value, dict) else \
            value if isinstance(value, (list, tuple)) else ()
        for item in items:
            if isinstance(item, Tensor) and item.requires_grad:
                raise TypeError(f"checkpoint: a {type(value).__name__} argument holds a tensor "
                                f"of shape {tuple(item.array.shape)} that requires grad; pass it "
                                "as an argument of its own")


def _unique(tensors: Any) -> List[Tensor]:
    """In first-seen order, each tensor once (tensors hash by identity)."""
    return list(dict.fromkeys(tensors))


def _name(function: Callable[..., Any]) -> str:
    return getattr(function, "__qualname__", None) or type(function).__name__


@contextlib.contextmanager
def _replayed_rng(generator: np.random.Generator, state: Optional[dict]) -> Iterator[None]:
    """Inside: ``generator`` is the global one, in ``state``. After: the global generator and
    ``generator``'s state are as before, as if nothing had been drawn."""
    if state is None:
        yield
        return
    resume = generator.bit_generator.state
    current = set_rng(generator)
    generator.bit_generator.state = state
    try:
        yield
    finally:
        generator.bit_generator.state = resume
        set_rng(current)
