"""The structure of a saved object: everything but its arrays, as JSON (the table in the package
docstring), and back.

Decoding trusts nothing in the file: every node must have exactly the keys and value types that
``encode`` writes, every array is named exactly once, and containers nest at most
``MAX_DEPTH`` deep, which ``encode`` enforces too, so a file ``save`` wrote always loads.
"""
from __future__ import annotations

import json
import math
import reprlib
import sys
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional

import numpy as np

from ..core.bfloat16 import is_bfloat16
from ..core.dtypes import is_floating
from ..core.tensor import Tensor

# Containers inside containers; a training snapshot nests about five deep. The bound keeps
# decoding far from Python's recursion limit (a dict level is three JSON levels).
MAX_DEPTH = 100
_FLOAT_SIZES = (2, 4, 8)
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}
_DEVICES = ("cpu", "cuda")
_SCALARS = (type(None), bool, int, float, str)
# The keys of each kind of tagged node, told apart by the first.
_NODE_KEYS = {"tuple": {"tuple"}, "dict": {"dict", "ordered"}, "float": {"float"},
              "array": {"array", "device"}, "scalar": {"scalar"},
              "tensor": {"tensor", "device", "requires_grad", "parameter"}}
_SHORT = reprlib.Repr()
_SHORT.maxstring, _SHORT.maxother, _SHORT.maxlevel = 60, 60, 3


def short(value: Any) -> str:
    """``repr(value)``, cut short: a damaged node may be as large as its file."""
    return _SHORT.repr(value)


def parse_json(text: str) -> Any:
    """JSON as ``save`` writes it: no NaN or Infinity; ValueError when nested too deep to
    parse."""
    def refuse_constant(word: str) -> Any:
        raise ValueError(f"{word} is not a JSON value")
    try:
        return json.loads(text, parse_constant=refuse_constant)
    except RecursionError:
        raise ValueError("it is nested deeper than the JSON parser goes") from None


# ----- encode ------------------------------------------------------------------------------
def _parameter_type() -> Optional[type]:
    # No Parameter can exist before ``neural_arch.nn.parameter`` is imported; importing it
    # here just to check would load all of ``nn`` for every save.
    module = sys.modules.get("neural_arch.nn.parameter")
    return None if module is None else module.Parameter


def _savable(dtype: np.dtype) -> bool:
    # bfloat16 (ml_dtypes' NumPy dtype, of kind "V") is written as safetensors' own BF16
    return (dtype.kind in "biu" or (dtype.kind == "f" and dtype.itemsize in _FLOAT_SIZES)
            or is_bfloat16(dtype))


def _host_array(array: Any, where: str) -> np.ndarray:
    if hasattr(array, "__cuda_array_interface__"):
        array = array.get()
    dtype = array.dtype
    if not _savable(dtype):
        raise TypeError(f"save: {where} is an array of dtype {dtype}; save writes bool, int8 to "
                        f"int64, uint8 to uint64, float16, bfloat16, float32 and float64 "
                        f"arrays")
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array if array.flags.c_contiguous else array.copy(order="C")  # keeps 0-d arrays


def _add_array(array: Any, where: str, arrays: Dict[str, np.ndarray]) -> str:
    entry = str(len(arrays))
    arrays[entry] = _host_array(array, where)
    return entry


def encode(obj: Any, where: str, arrays: Dict[str, np.ndarray], open_ids: set,
           depth: int = 0) -> Any:
    """The structure of ``obj``; its arrays go into ``arrays``. ``where`` names ``obj`` in
    errors, ``open_ids`` holds the containers around it (a cycle), ``depth`` counts them."""
    kind = type(obj)
    if obj is None or kind in (bool, int, str):
        return obj
    if kind is float:
        if math.isfinite(obj):
            return obj
        return {"float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
    if isinstance(obj, Tensor):
        parameter = _parameter_type()
        return {"tensor": _add_array(obj.array, where, arrays), "device": obj.device,
                "requires_grad": bool(obj.requires_grad),
                "parameter": parameter is not None and isinstance(obj, parameter)}
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        device = "cpu" if isinstance(obj, np.ndarray) else "cuda"
        return {"array": _add_array(obj, where, arrays), "device": device}
    if isinstance(obj, np.generic) and _savable(obj.dtype):
        return {"scalar": _add_array(np.asarray(obj), where, arrays)}
    if kind not in (list, tuple, dict, OrderedDict):
        raise TypeError(f"save: {where} is a {kind.__module__}.{kind.__qualname__}; save writes "
                        f"dicts, lists and tuples of arrays, tensors, ints, floats, bools, None "
                        f"and strings (no pickle, so no other objects)")
    if id(obj) in open_ids:
        raise ValueError(f"save: {where} contains itself; a reference cycle cannot be saved")
    if depth == MAX_DEPTH:
        raise ValueError(f"save: {where} is nested deeper than {MAX_DEPTH} containers (lists, "
                         f"tuples, dicts in one another), more than load reads back")
    open_ids.add(id(obj))
    try:
        if kind is list:
            return [encode(v, f"{where}[{i}]", arrays, open_ids, depth + 1)
                    for i, v in enumerate(obj)]
        if kind is tuple:
            return {"tuple": [encode(v, f"{where}[{i}]", arrays, open_ids, depth + 1)
                              for i, v in enumerate(obj)]}
        items = []
        for key, value in obj.items():
            if type(key) not in (str, int, bool):
                raise TypeError(f"save: {where} has a key {key!r} of type "
                                f"{type(key).__name__}; dict keys must be str, int or bool")
            items.append([key, encode(value, f"{where}[{key!r}]", arrays, open_ids, depth + 1)])
        return {"dict": items, "ordered": kind is OrderedDict}
    finally:
        open_ids.discard(id(obj))


# ----- decode ------------------------------------------------------------------------------
class Decoder:
    """Builds the object from a structure and the file's arrays, checking every node.

    ``place(array, saved_device)`` puts an array on the device it is loaded onto; ``name``
    names the file in errors.
    """

    def __init__(self, arrays: Dict[str, np.ndarray], place: Callable[[np.ndarray, str], Any],
                 name: str) -> None:
        self.arrays, self.place, self.name = arrays, place, name
        self.unused = set(arrays)

    def damaged(self, where: str, what: str) -> ValueError:
        return ValueError(f"load: {self.name} is damaged: {where} {what}")

    def decode(self, structure: Any) -> Any:
        obj = self.node(structure, "obj", 0)
        if self.unused:
            raise ValueError(f"load: {self.name} is damaged: it holds arrays its structure "
                             f"never names: {short(sorted(self.unused))}")
        return obj

    def node(self, node: Any, where: str, depth: int) -> Any:
        if type(node) in _SCALARS:
            return node
        kind = type(node).__name__ if type(node) is list else self._tag(node, where)
        if kind in ("list", "tuple", "dict") and depth == MAX_DEPTH:
            raise self.damaged(where, f"is nested deeper than {MAX_DEPTH} containers, "
                                      f"deeper than save writes")
        if kind == "list":
            return [self.node(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(node)]
        if kind == "tuple":
            return tuple(self.node(v, f"{where}[{i}]", depth + 1)
                         for i, v in enumerate(node["tuple"]))
        if kind == "dict":
            return self._dict(node, where, depth)
        if kind == "float":
            return _NONFINITE[node["float"]]
        array = self._array(node[kind], where)
        if kind == "scalar":
            if array.ndim != 0:
                raise self.damaged(where, f"is a scalar, but its array {node[kind]!r} has "
                                          f"{array.ndim} dimensions")
            return array[()]
        placed = self.place(array, node["device"])
        if kind == "array":
            return placed
        if node["requires_grad"] and not is_floating(array.dtype):
            raise self.damaged(where, f"is a tensor of dtype {array.dtype} with requires_grad "
                                      f"true, which only floating tensors have")
        if node["parameter"]:
            from ..nn.parameter import Parameter
            return Parameter(placed, requires_grad=node["requires_grad"])
        return Tensor(placed, requires_grad=node["requires_grad"], dtype=placed.dtype)

    def _tag(self, node: Any, where: str) -> str:
        """The kind of a tagged node, after checking its keys and the types of its values."""
        kind = next((tag for tag in _NODE_KEYS if isinstance(node, dict) and tag in node), None)
        if kind is None or set(node) != _NODE_KEYS[kind] or not _values_fit(kind, node):
            raise self.damaged(where, f"is {short(node)}, which is no node of the structure "
                                      f"save writes")
        return kind

    def _dict(self, node: dict, where: str, depth: int) -> Dict[Any, Any]:
        out: Dict[Any, Any] = OrderedDict() if node["ordered"] else {}
        for item in node["dict"]:
            if not (type(item) is list and len(item) == 2 and type(item[0]) in (str, int, bool)):
                raise self.damaged(where, f"has the item {short(item)}, not a [key, value] "
                                          f"pair with a str, int or bool key")
            key = item[0]
            if key in out:  # save writes each key of a dict once (and 1 and True are one key)
                raise self.damaged(where, f"has the key {key!r} twice")
            out[key] = self.node(item[1], f"{where}[{key!r}]", depth + 1)
        return out

    def _array(self, entry: str, where: str) -> np.ndarray:
        if entry not in self.arrays:
            raise self.damaged(where, f"names no array of the file ({entry!r})")
        if entry not in self.unused:
            raise self.damaged(where, f"names the array {entry!r} a second time; save writes "
                                      f"each array once")
        self.unused.discard(entry)
        return self.arrays[entry]


def _values_fit(kind: str, node: dict) -> bool:
    """Whether the values of a node with the right keys have the types ``encode`` writes."""
    if kind == "tuple":
        return type(node["tuple"]) is list
    if kind == "dict":
        return type(node["dict"]) is list and type(node["ordered"]) is bool
    if kind == "float":
        return type(node["float"]) is str and node["float"] in _NONFINITE
    if type(node[kind]) is not str:
        return False
    if kind == "scalar":
        return True
    if node["device"] not in _DEVICES:
        return False
    return kind == "array" or (type(node["requires_grad"]) is bool
                               and type(node["parameter"]) is bool)
