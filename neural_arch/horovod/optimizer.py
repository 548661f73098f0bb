"""``DistributedOptimizer``: gradients averaged over the ranks as backward produces them.

A hook on every parameter (``register_post_accumulate_grad_hook``) counts the backward passes
that reached it; on the ``backward_passes_per_step``-th the parameter is ready, and its
gradient's all-reduce starts in the background while backward goes on. ``step()`` (or an
explicit ``synchronize()``) launches what is not launched yet, waits, and puts the averages in
``.grad``. Counters start again after every synchronisation.

Every rank launches every parameter exactly once per step, in one fixed order (the reverse of
the order of ``named_parameters``, else of the optimizer's parameters: roughly the order
backward produces gradients), so gradients are matched by parameter name even where ranks
list the optimizer's parameters in different orders; the step's round carries a checksum of
the names in that order, and ranks that name them differently raise. A parameter is launched
once it and all before it are ready, the rest at ``synchronize()``. So ranks whose backward
skipped a parameter, or reached it fewer times, still issue the same collectives: a parameter
without a gradient contributes zeros (as in Horovod) and gets the averaged result, which is
zero where no rank had a gradient. Nothing waits for a collective that is not coming.

The first launch of a step also starts the agreement round of ``rounds``; a rank inside
``hvd.join()`` answers the step with zeros, and Average divides by the ranks that contributed.

The wrapper is an instance of a subclass of the wrapped optimizer's class sharing its
attributes (Horovod's design), so ``isinstance``, LR schedulers, ``param_groups``, ``state``,
``state_dict`` and ``zero_grad`` work as before.
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Any, Dict, List, Tuple

import numpy as np

from .. import distributed as dist
from ..optim.optimizer import Optimizer
from . import basics, ops, rounds
from .compression import Average, Compression, check_compression, resolve_op

_REGISTRY: List[weakref.ref] = []  # creation order = the same index on every rank


class _DistributedMixin:
    """The methods a ``DistributedOptimizer`` adds to (or puts in front of) the optimizer's."""

    def _hvd_setup(self, named_parameters, compression, backward_passes_per_step, op,
                   gradient_predivide_factor) -> None:
        params = [p for group in self.param_groups for p in group["params"]]
        names, order = _names(params, named_parameters)
        if isinstance(backward_passes_per_step, bool) or not isinstance(
                backward_passes_per_step, int) or backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got "
                             f"{backward_passes_per_step!r}")
        op = resolve_op(op, None, "DistributedOptimizer")
        compression = check_compression(compression, "DistributedOptimizer")
        factor = float(gradient_predivide_factor)
        if factor != 1.0 and op is not Average:
            raise ValueError(f"gradient_predivide_factor={factor} needs op=hvd.Average (it "
                             f"divides before the sum and multiplies after), got op={op!r}")
        if not factor > 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {factor}")
        hookless = [names[i] for i, p in enumerate(params)
                    if not callable(getattr(p, "register_post_accumulate_grad_hook", None))]
        if hookless:
            raise TypeError(f"DistributedOptimizer needs Tensor parameters (their gradient hooks "
                            f"start the all-reduces); {hookless} are not")
        # Everything is checked: set from here on, so a refused wrap leaves the optimizer as
        # it was.
        self._hvd_order = [params[i] for i in reversed(order)
                           if getattr(params[i], "requires_grad", True)]
        self._hvd_names = {id(p): names[i] for i, p in enumerate(params)}
        self._hvd_names_code = rounds.names_code([self._hvd_names[id(p)]
                                                  for p in self._hvd_order])
        self._hvd_compression = compression
        self._hvd_k, self._hvd_op, self._hvd_factor = backward_passes_per_step, op, factor
        self._hvd_id = len(_REGISTRY)
        _REGISTRY.append(weakref.ref(self))
        self._hvd_passes: Dict[int, int] = {}
        self._hvd_launched: Dict[int, Any] = {}  # id -> finish(): the averaged gradient
        self._hvd_next = 0       # index into _hvd_order of the next parameter to launch
        self._hvd_round = None   # the agreement round of the step being launched
        self._hvd_synced = False  # synchronize() ran and step() has not
        self._hvd_skip = False
        ref = weakref.ref(self)
        self._hvd_hooks = [p.register_post_accumulate_grad_hook(_hook(ref))
                           for p in self._hvd_order]

    # -- during backward ----------------------------------------------------------------
    def _hvd_grad_ready(self, param) -> None:
        name = self._hvd_names.get(id(param), "?")
        if self._hvd_synced:
            raise RuntimeError(
                f"backward() reached parameter {name!r} after optimizer.synchronize() and before "
                "optimizer.step(): its gradient was already averaged. Call step() (inside "
                "optimizer.skip_synchronize()) before the next backward")
        passes = self._hvd_passes.get(id(param), 0) + 1
        if passes > self._hvd_k:
            raise RuntimeError(
                f"Gradients were computed more than backward_passes_per_step "
                f"({self._hvd_k}) times before call to step() (parameter {name!r}, pass "
                f"{passes}). Increase backward_passes_per_step to accumulate gradients locally.")
        self._hvd_passes[id(param)] = passes
        if basics.size() > 1:
            self._hvd_launch_ready()

    def _hvd_launch_ready(self) -> None:
        order = self._hvd_order
        while (self._hvd_next < len(order)
               and self._hvd_passes.get(id(order[self._hvd_next]), 0) == self._hvd_k):
            self._hvd_launch(order[self._hvd_next])
            self._hvd_next += 1

    def _hvd_launch(self, param) -> None:
        if self._hvd_round is None:
            self._hvd_round = rounds.start_round(rounds.STEP, count=len(self._hvd_order),
                                                 optimizer=self._hvd_id,
                                                 names=self._hvd_names_code)
        data = param.array
        grad = param.grad.array if param.grad is not None else np.zeros_like(data)
        grad = np.asarray(grad, dtype=data.dtype)
        _, finish = ops.start_allreduce(grad, self._hvd_op, self._hvd_compression,
                                        1.0 / self._hvd_factor, self._hvd_factor,
                                        "DistributedOptimizer", self._hvd_round)
        self._hvd_launched[id(param)] = finish

    # -- synchronisation ----------------------------------------------------------------
    def synchronize(self) -> None:
        """Finish averaging every gradient now (before clipping them, say); then call
        ``step()`` inside ``skip_synchronize()``. A second call before ``step()`` does
        nothing: the gradients are averaged once per step."""
        basics._layout()
        if self._hvd_synced or basics.size() == 1:
            self._hvd_reset()
            self._hvd_synced = True
            return
        try:
            order = self._hvd_order
            while self._hvd_next < len(order):
                self._hvd_launch(order[self._hvd_next])
                self._hvd_next += 1
            for param in order:
                finish = self._hvd_launched[id(param)]
                param.grad = finish()
        finally:
            self._hvd_reset()
        self._hvd_synced = True

    def _hvd_reset(self) -> None:
        self._hvd_passes.clear()
        self._hvd_launched.clear()
        self._hvd_next, self._hvd_round = 0, None

    @contextlib.contextmanager
    def skip_synchronize(self):
        """``step()`` inside applies the gradients ``synchronize()`` already averaged."""
        previous, self._hvd_skip = self._hvd_skip, True
        try:
            yield
        finally:
            self._hvd_skip = previous

    def step(self, closure=None):
        if self._hvd_skip and not self._hvd_synced and (self._hvd_passes or self._hvd_launched):
            raise RuntimeError(
                "optimizer.step() inside skip_synchronize() without optimizer.synchronize() "
                "first: the gradients are this rank's own and the replicas would drift apart. "
                "Call optimizer.synchronize() before the with-block")
        if not self._hvd_synced:
            self.synchronize()
        # After an explicit synchronize() the gradients are averaged already: stepping
        # without skip_synchronize() applies them as they are, never all-reducing twice.
        try:
            return super().step(closure)
        finally:
            self._hvd_synced = False

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._hvd_launched:
            raise RuntimeError(
                "optimizer.zero_grad() was called after loss.backward() but before "
                "optimizer.step() or optimizer.synchronize(): the all-reduce of "
                f"{len(self._hvd_launched)} gradients is under way")
        super().zero_grad(set_to_none)

    # -- for join() ------------------------------------------------------------------------
    def _hvd_mirror_step(self) -> None:
        """A joined rank's part of a step: zeros for every gradient, in the launch order."""
        wire = self._hvd_compression.wire_dtype
        for param in self._hvd_order:
            dist.all_reduce(np.zeros(param.array.size, dtype=wire(param.array.dtype)))


def _hook(ref):
    def hook(param) -> None:
        owner = ref()
        if owner is not None:
            owner._hvd_grad_ready(param)
    return hook


def _names(params: list, named_parameters: Any) -> Tuple[List[str], List[int]]:
    """A name per parameter, in ``params`` order, and the positions in ``params`` listed in
    the order of ``named_parameters`` (the same on every rank that built the same model);
    duplicate or missing names raise."""
    if named_parameters is None:
        return [f"allreduce.noname.{i}" for i in range(len(params))], list(range(len(params)))
    pairs = list(named_parameters)
    if any(not (isinstance(p, tuple) and len(p) == 2) for p in pairs):
        raise ValueError("named_parameters should be a sequence of (name, parameter) tuples, "
                         "usually model.named_parameters()")
    seen: Dict[str, int] = {}
    for name, _ in pairs:
        seen[name] = seen.get(name, 0) + 1
    dups = sorted(n for n, c in seen.items() if c > 1)
    if dups:
        raise ValueError(f"Parameter names in named_parameters must be unique. Found "
                         f"duplicates: {', '.join(dups)}")
    by_id = {id(p): n for n, p in pairs}
    missing = [i for i, p in enumerate(params) if id(p) not in by_id]
    if missing:
        raise ValueError(f"named_parameters was specified, but {len(missing)} parameters of the "
                         f"optimizer were not named (positions {missing} over its param_groups)")
    position = {id(p): i for i, (_, p) in enumerate(pairs)}
    order = sorted(range(len(params)), key=lambda i: position[id(params[i])])
    return [by_id[id(p)] for p in params], order


def DistributedOptimizer(optimizer: Any, named_parameters: Any = None,
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,
                         process_set: Any = None):
    """Wrap ``optimizer`` (one of ``neural_arch.optim``) so that ``step()`` applies gradients
    averaged (op=hvd.Average) or summed (op=hvd.Sum) over every rank."""
    basics._layout()
    if not isinstance(optimizer, Optimizer):
        raise TypeError(f"hvd.DistributedOptimizer wraps a neural_arch.optim optimizer, got "
                        f"{type(optimizer).__name__}")
    if isinstance(optimizer, _DistributedMixin) or "_hvd_order" in vars(optimizer):
        raise ValueError("hvd.DistributedOptimizer: this optimizer is already distributed")
    ops._check_process_set(process_set, "DistributedOptimizer")
    cls = type(type(optimizer).__name__, (_DistributedMixin, type(optimizer)),
               {"__doc__": f"{type(optimizer).__name__} averaging gradients over the ranks "
                           "(hvd.DistributedOptimizer)."})
    wrapped = object.__new__(cls)
    wrapped.__dict__ = optimizer.__dict__  # one state: the original and the wrapper agree
    wrapped._hvd_setup(named_parameters, compression, backward_passes_per_step, op,
                       gradient_predivide_factor)
    return wrapped


def _mirror_step(rnd: rounds.Round) -> None:
    index = rnd.fields["optimizer"]
    owner = _REGISTRY[index]() if index < len(_REGISTRY) else None
    if owner is None:
        raise RuntimeError(f"hvd.join(): the training ranks step DistributedOptimizer #{index}, "
                           "which this rank does not have (every rank must create the same "
                           "DistributedOptimizers in the same order and keep them alive)")
    owner._hvd_mirror_step()


rounds.register_mirror(rounds.STEP, _mirror_step)
