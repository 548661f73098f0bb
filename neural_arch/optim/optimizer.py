"""Optimizer base class: parameter groups, per-parameter state and (de)serialisation.

Parameters are duck-typed (anything with a writable ``.array``, a ``.grad`` that is None or
has an ``.array``, and ``mark_modified_in_place()``, as a ``Tensor`` does), so optimizers work
on ``Parameter``s and plain ``Tensor``s holding NumPy or CuPy storage alike. A step writes
``.array`` in place and says so through ``mark_modified_in_place()``: a backward through a graph
recorded before the step raises, as in torch, instead of using the updated weights.
"""
from __future__ import annotations

import copy
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple

import numpy as np

from ..backends import backend_for
from ..core.grad_reset import zero_grads


class ParamState:
    """Per-parameter state keyed by parameter identity (tensors need not be hashable)."""

    def __init__(self) -> None:
        self._params: Dict[int, Any] = {}
        self._states: Dict[int, Dict[str, Any]] = {}

    def __getitem__(self, param: Any) -> Dict[str, Any]:
        key = id(param)
        if key not in self._states:
            self._params[key] = param
            self._states[key] = {}
        return self._states[key]

    def __setitem__(self, param: Any, value: Dict[str, Any]) -> None:
        self._params[id(param)] = param
        self._states[id(param)] = value

    def __contains__(self, param: Any) -> bool:
        return id(param) in self._states

    def __iter__(self) -> Iterator[Any]:
        return iter(list(self._params.values()))

    def __len__(self) -> int:
        return len(self._states)

    def get(self, param: Any, default: Any = None) -> Any:
        return self._states.get(id(param), default)

    def clear(self) -> None:
        self._params.clear()
        self._states.clear()


def _array_like(value: Any, ref: Any) -> Any:
    """Copy ``value`` into an array of ``ref``'s dtype on ``ref``'s array module (NumPy/CuPy)."""
    if hasattr(value, "__cuda_array_interface__") and isinstance(ref, np.ndarray):
        value = value.get()
    return backend_for(ref).xp.array(value, dtype=ref.dtype, copy=True)


def _copy_value(value: Any) -> Any:
    if hasattr(value, "shape") and hasattr(value, "copy"):
        return value.copy()
    return copy.deepcopy(value)


def parameters_with_grad(group: Dict[str, Any]) -> Iterator[Tuple[Any, Any]]:
    """(parameter, its gradient's array) for each parameter of ``group`` that has a gradient;
    one without (unused by the loss, or its gradient set to None) is skipped, as torch's
    optimizers skip it."""
    for param in group["params"]:
        if param.grad is not None:
            yield param, param.grad.array


class Optimizer:
    """Base class: subclasses define ``step(closure=None)`` over ``param_groups`` and ``state``."""

    def __init__(self, params: Iterable[Any], defaults: Dict[str, Any]) -> None:
        if hasattr(params, "array") and hasattr(params, "grad"):
            raise TypeError(
                f"params must be an iterable of tensors or dicts, got a single "
                f"{type(params).__name__}")
        self.defaults = dict(defaults)
        self.state = ParamState()
        self.param_groups: List[Dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError("optimizer got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, param_group: Dict[str, Any]) -> None:
        """Add a group of parameters with its own hyper-parameters (missing ones use defaults)."""
        if not isinstance(param_group, dict):
            raise TypeError(f"param_group must be a dict, got {type(param_group).__name__}")
        group = dict(param_group)
        params = group["params"]
        if hasattr(params, "array") and hasattr(params, "grad"):
            params = [params]
        params = list(params)
        for index, param in enumerate(params):
            if not (hasattr(param, "array") and hasattr(param, "grad")):
                raise TypeError(
                    f"optimizer can only optimize tensors, parameter {index} of the group is a "
                    f"{type(param).__name__}")
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if len({id(p) for p in params}) != len(params):
            raise ValueError("a parameter group contains the same parameter more than once")
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        group["params"] = params
        for name, default in self.defaults.items():
            group.setdefault(name, default)
        self.param_groups.append(group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset gradients: drop them (default) or fill them with zeros in place."""
        zero_grads((param for group in self.param_groups for param in group["params"]),
                   set_to_none)

    def _evaluate_closure(self, closure: Optional[Callable[[], Any]]) -> Any:
        return None if closure is None else closure()

    def _ordered_params(self) -> List[Any]:
        return [p for group in self.param_groups for p in group["params"]]

    def state_dict(self) -> Dict[str, Any]:
        """PyTorch's layout: parameters are replaced by their index over all groups."""
        index_of = {id(p): i for i, p in enumerate(self._ordered_params())}
        groups = []
        for group in self.param_groups:
            packed = {k: copy.deepcopy(v) for k, v in group.items() if k != "params"}
            packed["params"] = [index_of[id(p)] for p in group["params"]]
            groups.append(packed)
        state = {index_of[id(p)]: {k: _copy_value(v) for k, v in self.state[p].items()}
                 for p in self.state if id(p) in index_of}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """Restore hyper-parameters and state saved by ``state_dict`` (values are copied)."""
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.param_groups):
            raise ValueError(
                f"loaded state dict has {len(saved_groups)} parameter groups, the optimizer has "
                f"{len(self.param_groups)}")
        for i, (saved, group) in enumerate(zip(saved_groups, self.param_groups)):
            if len(saved["params"]) != len(group["params"]):
                raise ValueError(
                    f"parameter group {i} has {len(saved['params'])} parameters in the loaded "
                    f"state dict and {len(group['params'])} in the optimizer")
        params_by_index = {}
        for saved, group in zip(saved_groups, self.param_groups):
            params_by_index.update(zip(saved["params"], group["params"]))
        new_state = ParamState()
        for index, saved_state in state_dict["state"].items():
            index = int(index)
            if index not in params_by_index:
                raise ValueError(f"loaded optimizer state refers to unknown parameter index "
                                 f"{index}")
            param = params_by_index[index]
            restored = {}
            for key, value in saved_state.items():
                if hasattr(value, "shape") and tuple(value.shape) == tuple(param.array.shape):
                    restored[key] = _array_like(value, param.array)
                elif hasattr(value, "shape") and len(value.shape) > 0:
                    raise ValueError(
                        f"optimizer state '{key}' of parameter {index} has shape "
                        f"{tuple(value.shape)}, the parameter has shape {tuple(param.array.shape)}")
                else:
                    restored[key] = copy.deepcopy(value)
            new_state[param] = restored
        self.state = new_state
        for saved, group in zip(saved_groups, self.param_groups):
            for key, value in saved.items():
                if key != "params":
                    group[key] = copy.deepcopy(value)

    def __repr__(self) -> str:
        lines = [f"{type(self).__name__} ("]
        for i, group in enumerate(self.param_groups):
            lines.append(f"Parameter Group {i}")
            for key in sorted(k for k in group if k != "params"):
                lines.append(f"    {key}: {group[key]}")
        lines.append(")")
        return "\n".join(lines)
