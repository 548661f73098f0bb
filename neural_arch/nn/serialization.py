"""State dicts on disk as safetensors files (plain arrays, never pickle)."""
from __future__ import annotations

import os
from collections import OrderedDict
from typing import Any, Dict, Union

import numpy as np
from safetensors.numpy import load_file, save_file

PathLike = Union[str, "os.PathLike[str]"]


def save_state_dict(state_dict_or_module: Any, path: PathLike) -> None:
    """Write a ``{name: array or tensor}`` dict (or a Module's ``state_dict()``) to ``path``."""
    state = state_dict_or_module
    if hasattr(state, "state_dict") and callable(state.state_dict):
        state = state.state_dict()
    if not isinstance(state, dict):
        raise TypeError(f"expected a state dict or a Module, got {type(state).__name__}")
    arrays: Dict[str, np.ndarray] = {}
    for key, value in state.items():
        if not isinstance(key, str):
            raise TypeError(f"state dict keys must be strings, got {key!r}")
        data = getattr(value, "array", value) if hasattr(value, "requires_grad") else value
        if not isinstance(data, np.ndarray) and hasattr(data, "get"):
            data = data.get()
        # np.require keeps 0-d arrays 0-d (np.ascontiguousarray would make them 1-d)
        arrays[key] = np.require(np.asarray(data), requirements="C")
    save_file(arrays, os.fspath(path))


def load_state_dict_file(path: PathLike) -> "OrderedDict[str, np.ndarray]":
    """Read a safetensors file into ``{name: NumPy array}``."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no state dict file at {os.fspath(path)}")
    return OrderedDict(load_file(os.fspath(path)))
