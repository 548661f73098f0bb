"""Checkpoint values as JSON: what JSON cannot hold exactly becomes a small tagged object.

``{"__nf__": kind, ...}`` stands for a tuple, a non-finite float, a NumPy scalar or array
(base64 bytes) and a dict with non-string keys; ``decode`` turns each back into what it was.
Anything else raises TypeError naming where in the state it sits. Nothing is ever pickled.
"""
from __future__ import annotations

import base64
from typing import Any

import numpy as np

_TAG = "__nf__"


def host_array(value: Any) -> np.ndarray:
    if not isinstance(value, np.ndarray) and hasattr(value, "get"):
        value = value.get()  # CuPy array: bring it to host memory
    return np.ascontiguousarray(np.asarray(value))


def is_array(value: Any) -> bool:
    return isinstance(value, np.ndarray) or hasattr(value, "__cuda_array_interface__")


def encode(value: Any, where: str = "state") -> Any:
    """A JSON-ready copy of ``value``; TypeError naming ``where`` for what cannot be stored."""
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.generic):
        if value.dtype.kind not in "biuf":
            raise TypeError(f"{where}: cannot store a NumPy {value.dtype} scalar in a checkpoint")
        return {_TAG: "scalar", "dtype": value.dtype.str, "value": encode(value.item(), where)}
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if np.isfinite(value):
            return float(value)
        return {_TAG: "float", "value": repr(float(value))}
    if is_array(value):
        array = host_array(value)
        if array.dtype.kind not in "biufc":
            raise TypeError(f"{where}: cannot store an array of dtype {array.dtype} in a "
                            f"checkpoint")
        return {_TAG: "array", "dtype": array.dtype.str, "shape": list(array.shape),
                "data": base64.b64encode(array.tobytes()).decode("ascii")}
    if isinstance(value, tuple):
        return {_TAG: "tuple", "items": [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]}
    if isinstance(value, list):
        return [encode(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, dict):
        if all(isinstance(k, str) for k in value) and _TAG not in value:
            return {k: encode(v, f"{where}[{k!r}]") for k, v in value.items()}
        return {_TAG: "dict", "items": [[encode(k, f"{where} key"), encode(v, f"{where}[{k!r}]")]
                                        for k, v in value.items()]}
    raise TypeError(f"{where}: cannot store a {type(value).__name__} in a checkpoint (only "
                    f"JSON data, NumPy scalars and arrays)")


def decode(value: Any) -> Any:
    """Inverse of ``encode``."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(_TAG)
    if kind is None:
        return {k: decode(v) for k, v in value.items()}
    if kind == "float":
        return float(value["value"])
    if kind == "tuple":
        return tuple(decode(v) for v in value["items"])
    if kind == "dict":
        return {_hashable(decode(k)): decode(v) for k, v in value["items"]}
    if kind == "scalar":
        return np.dtype(value["dtype"]).type(decode(value["value"]))
    if kind == "array":
        raw = base64.b64decode(value["data"])
        return np.frombuffer(raw, dtype=np.dtype(value["dtype"])).reshape(value["shape"]).copy()
    raise ValueError(f"unknown tagged value kind {kind!r} in checkpoint data")


def _hashable(key: Any) -> Any:
    return tuple(_hashable(k) for k in key) if isinstance(key, (list, tuple)) else key


def check_json_data(value: Any, where: str) -> None:
    """Raise TypeError naming the offending key unless ``value`` is plain JSON data
    (dicts with string keys, lists, tuples, str, int, float, bool, None)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            check_json_data(item, f"{where}[{i}]")
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{where} has the non-string key {key!r} "
                                f"({type(key).__name__}); JSON object keys are strings")
            check_json_data(item, f"{where}[{key!r}]")
        return
    raise TypeError(f"{where} is a {type(value).__name__}, which JSON cannot hold "
                    f"(checkpoints store no pickles)")
