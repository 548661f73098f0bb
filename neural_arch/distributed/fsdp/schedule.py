"""When each unit gathers, frees and averages: the hooks around forward and backward.

Forward: the root unit is gathered when the wrapper's forward starts; every other unit just
before its own forward (its module's ``forward`` is wrapped) and, under FULL_SHARD, freed
right after it. From the second iteration on, the order units ran in is known, so starting a
unit's forward also starts gathering the next one in the background (prefetch).

Backward: a hook on each unit's output tensors fires once their gradient is complete, i.e.
before any of the unit's own backward runs; it gathers the unit again (FULL_SHARD freed it)
and starts gathering the next unit in the recorded backward order. Post-accumulate-grad hooks
count each unit's parameters; when the last one's gradient is final, the full gradients are
packed into one vector and averaged in the background (reduce-scatter into the shard), and
the full parameters are freed. Averaging is launched in a fixed order (reverse module order)
so that every rank issues the same collectives in the same order. A callback queued for the
end of backward handles units whose parameters got no gradient (they average zeros: unlike
DDP, a unit that no rank used gets a zero gradient, not None), waits for every collective,
and frees whatever is still gathered.

Inside ``no_sync()`` the full gradients stay on the parameters and accumulate there; the
first backward outside it averages the sums.

Every rank must run the same units in the same order: the collectives of different ranks are
paired by their order. Within a unit, parameters may take part on some ranks only.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ...core import Tensor, autograd
from .flat_param import GatherStats
from .options import ShardingStrategy
from .unit import Unit


def output_tensors(value: Any) -> List[Tensor]:
    """The tensors that need a gradient in a (nested) forward output."""
    if isinstance(value, Tensor):
        return [value] if value.requires_grad else []
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in output_tensors(item)]
    if isinstance(value, dict):
        return [t for item in value.values() for t in output_tensors(item)]
    return []


class Schedule:
    """The per-iteration state of one wrapper's units."""

    def __init__(self, root: Optional[Unit], others: List[Unit], strategy: ShardingStrategy,
                 stats: GatherStats, prefetch: bool) -> None:
        self.root, self.others = root, others
        self.units = ([root] if root is not None else []) + others
        self.strategy, self.stats, self.prefetch = strategy, stats, prefetch
        self.unit_of: Dict[int, Unit] = {id(p): u for u in self.units for p in u.params}
        self.forward_order: List[Unit] = []    # recorded during the first forward
        self.backward_order: List[Unit] = []   # recorded during the first backward
        self.forward_known = self.backward_known = False
        self.sync_enabled = True
        self._backward: Optional[int] = None
        self._in_forward = False
        # Averaging is launched in reverse module order, the same on every rank whatever ran
        # (backward produces the last units' gradients first).
        self._launch_order: List[Unit] = list(reversed(self.units))
        self._next_launch = 0

    @property
    def busy(self) -> bool:
        """The wrapper's forward, or a backward (perhaps through the wrapper's graph, whose
        hooks may not have fired yet), is running on this thread."""
        return self._in_forward or autograd.current_backward() is not None

    # -- forward ---------------------------------------------------------------------------
    def root_pre_forward(self) -> None:
        self._in_forward = True
        if self.root is not None:
            self._record(self.forward_order, self.root, self.forward_known)
            self.root.gather()
            if self.prefetch and self.forward_known:
                self._prefetch_after(self.forward_order, self.root)

    def root_post_forward(self, output: Any) -> None:
        self._in_forward = False
        self.forward_known = True
        needs_grad = output_tensors(output)
        if self.strategy.frees_parameters:
            for unit in self.others:  # a prefetch the forward did not use
                unit.release()
            if self.root is not None and not needs_grad:
                self.root.release()  # no backward follows (evaluation)
        if self.root is not None:
            self._hook_outputs(self.root, needs_grad)

    def forward_failed(self) -> None:
        """The wrapped module raised: wait for what is under way and free what FULL_SHARD
        would have freed, so the next step starts clean."""
        self._in_forward = False
        for unit in self.units:
            unit.wait_gather()
            if self.strategy.frees_parameters:
                unit.release()

    def unit_pre_forward(self, unit: Unit) -> None:
        self._record(self.forward_order, unit, self.forward_known)
        unit.gather()
        if self.prefetch and self.forward_known:
            self._prefetch_after(self.forward_order, unit)

    def unit_post_forward(self, unit: Unit, output: Any) -> None:
        # A forward run inside a backward (activation checkpointing recomputing the unit) is
        # followed at once by the unit's own backward: keep it gathered for that.
        if self.strategy.frees_parameters and autograd.current_backward() is None:
            unit.release()
        self._hook_outputs(unit, output_tensors(output))

    @staticmethod
    def _record(order: List[Unit], unit: Unit, known: bool) -> None:
        if not known and unit not in order:
            order.append(unit)

    @staticmethod
    def _prefetch_after(order: List[Unit], unit: Unit) -> None:
        try:
            position = order.index(unit)
        except ValueError:
            return
        if position + 1 < len(order):
            order[position + 1].start_gather(async_op=True)

    def _hook_outputs(self, unit: Unit, tensors: List[Tensor]) -> None:
        def pre_backward(grad: Any) -> None:
            self.unit_pre_backward(unit)
        for tensor in tensors:
            tensor.register_hook(pre_backward)

    # -- backward --------------------------------------------------------------------------
    def _enter_backward(self) -> None:
        """Called by every hook: the first one of a backward sets it up. A backward nested in
        it (activation checkpointing differentiates its recomputed block with ``grad()``)
        belongs to it: its gradients reach the parameters in the outer one."""
        current = autograd.current_backward(outermost=True)
        if current == self._backward:
            return
        self._backward = current
        for unit in self.units:
            unit.abandon()  # what a backward that raised halfway left under way
            unit.begin_backward()
        self._next_launch = 0
        autograd.queue_callback(self._end_of_backward, outermost=True)

    def unit_pre_backward(self, unit: Unit) -> None:
        self._enter_backward()
        if unit.pre_backward_done:
            return
        unit.pre_backward_done = True
        self._record(self.backward_order, unit, self.backward_known)
        unit.gather()
        if self.prefetch and self.backward_known:
            self._prefetch_after(self.backward_order, unit)

    def grad_ready(self, param: Any) -> None:
        self._enter_backward()
        unit = self.unit_of[id(param)]
        if not unit.current:
            raise RuntimeError(
                f"FullyShardedDataParallel: a gradient reached a parameter of unit "
                f"{unit.name or '<root>'!r} while its full parameters were not gathered: the "
                "parameter was used outside its unit's forward (put modules that share "
                "parameters in one unit)")
        if unit.grad_arrived():
            self._complete(unit)

    def _complete(self, unit: Unit) -> None:
        unit.completed = True
        if self.strategy.frees_parameters:
            unit.release()
        if self.sync_enabled:
            self._launch_ready()

    def _launch_ready(self) -> None:
        order = self._launch_order
        while self._next_launch < len(order) and order[self._next_launch].completed:
            order[self._next_launch].pack_and_launch_reduce()
            self._next_launch += 1

    def _end_of_backward(self) -> None:
        try:
            for unit in self._launch_order:
                if not unit.completed:  # some parameters got no gradient
                    self._complete(unit)
            if self.sync_enabled:
                self._launch_ready()
                for unit in self._launch_order:
                    unit.finish_reduce()
                self.stats.generation += 1  # the optimizer may now change the shards
            self.backward_known = True
        finally:
            self._backward = None
            for unit in self.units:
                unit.abandon()  # no-ops after a clean backward
                if self.strategy.frees_parameters:
                    unit.release()
