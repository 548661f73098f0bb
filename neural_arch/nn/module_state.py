"""A module's state dict (``state_dict`` / ``load_state_dict``), as in torch: a base of
``Module``, kept apart so that registration and traversal stay in one readable file.

``state_dict()`` returns tensors that share storage with the parameters and persistent buffers
(detached views, or with ``keep_vars=True`` the Parameter objects themselves), so a collective
or a ``copy_`` that writes into an entry writes into the model, and taking one costs no copy.
Whoever needs values that later training does not change takes a copy: ``state_dict_copy``.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, Dict, List, NamedTuple, Optional, Tuple

import numpy as np

from ..backends import backend_for
from ..core import Tensor


class IncompatibleKeys(NamedTuple):
    missing_keys: List[str]
    unexpected_keys: List[str]


def host_array(value: Any) -> np.ndarray:
    """A NumPy array of a Tensor, a CuPy array or any array-like (shared where possible)."""
    if isinstance(value, Tensor):
        return value.numpy()
    if hasattr(value, "__cuda_array_interface__"):
        return value.get()
    return np.asarray(value)


def _entry(value: Any, keep_vars: bool) -> Tensor:
    """What the state dict holds for a parameter or buffer: the object itself with
    ``keep_vars``, else a detached tensor over the same array (never a copy)."""
    if isinstance(value, Tensor):
        return value if keep_vars else value.detach()
    return Tensor(value)  # an array buffer: wrapped, its array shared


def state_dict_copy(module: Any) -> "OrderedDict[str, np.ndarray]":
    """Name -> host NumPy copy of every state-dict entry: a snapshot that later training
    does not change (for checkpoints and returned weights)."""
    return OrderedDict((key, np.array(host_array(value), copy=True))
                       for key, value in module.state_dict().items())


class ModuleState:
    """``state_dict`` / ``load_state_dict`` over ``_parameters`` / ``_buffers`` /
    ``_non_persistent`` of each module in ``named_modules()``."""

    def state_dict(self, destination: Optional[Dict[str, Any]] = None, prefix: str = "",
                   keep_vars: bool = False) -> Dict[str, Any]:
        """Name -> tensor sharing storage with every parameter and persistent buffer (shared
        ones under each of their names), in torch's order: a module's own parameters, its
        buffers, then each child's. ``destination``: the dict to fill (a new OrderedDict when
        None); ``prefix``: put before every name; ``keep_vars``: the Parameter and buffer
        tensors themselves instead of detached tensors over the same arrays."""
        if destination is None:
            destination = OrderedDict()
        for key, (module, table, name) in self._state_targets().items():
            destination[prefix + key] = _entry(getattr(module, table)[name], keep_vars)
        return destination

    def _state_targets(self) -> "OrderedDict[str, Tuple[Any, str, str]]":
        """Dotted name -> (owning module, table, attribute) of every entry of the state dict."""
        targets: "OrderedDict[str, Tuple[Any, str, str]]" = OrderedDict()
        for prefix, module in self.named_modules():
            dot = f"{prefix}." if prefix else ""
            for name, param in module._parameters.items():
                if param is not None:
                    targets[dot + name] = (module, "_parameters", name)
            for name, buf in module._buffers.items():
                if buf is not None and name not in module._non_persistent:
                    targets[dot + name] = (module, "_buffers", name)
        return targets

    def load_state_dict(self, state_dict: Dict[str, Any], strict: bool = True) -> IncompatibleKeys:
        """Copy tensors or arrays into the parameters and buffers in place (dtype and device
        kept).

        A shape mismatch always raises ``ValueError`` naming the key and both shapes; with
        ``strict`` missing or unexpected keys raise ``KeyError``, else they are returned.
        """
        targets = self._state_targets()
        missing = [key for key in targets if key not in state_dict]
        unexpected = [key for key in state_dict if key not in targets]
        if strict and (missing or unexpected):
            raise KeyError(f"error loading state_dict into {type(self).__name__}: missing keys "
                           f"{missing}, unexpected keys {unexpected}")
        for key, (module, table, name) in targets.items():
            if key not in state_dict:
                continue
            source = host_array(state_dict[key])
            current = getattr(module, table)[name]
            array = current.array if isinstance(current, Tensor) else current
            if tuple(source.shape) != tuple(array.shape):
                raise ValueError(f"size mismatch for '{key}': the checkpoint has shape "
                                 f"{tuple(source.shape)}, the model has {tuple(array.shape)}")
            if isinstance(array, np.ndarray):
                np.copyto(array, source, casting="unsafe")
            else:
                array[...] = backend_for(array).asarray(source.astype(array.dtype))
            if isinstance(current, Tensor):
                current.mark_modified_in_place()
        return IncompatibleKeys(missing, unexpected)
