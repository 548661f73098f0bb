"""``save`` and ``load``: ``torch.save`` / ``torch.load`` for nested containers, without pickle.

A pickle runs code when it is loaded, so a checkpoint downloaded from elsewhere could take over
the machine; these files hold only data. The file is one safetensors file: every array and
tensor of the object is one entry (named "0", "1", ... in the order they are met), and the
object's shape, everything that is not an array, is JSON in the safetensors metadata under
``neural_arch.structure`` (``neural_arch.format`` is the version, "1"). Any safetensors reader
can list the arrays.

The structure, as JSON:

====================================================  ==========================================
``null``, ``true``, a string, an int, a float         themselves (JSON keeps ``3`` and ``3.0``
                                                      apart, so ints come back as ints)
``[...]``                                             a list
``{"tuple": [...]}``                                  a tuple (tuples come back as tuples)
``{"dict": [[key, value], ...], "ordered": bool}``    a dict (an ``OrderedDict`` when ordered);
                                                      keys are strings, ints or bools
``{"float": "nan" | "inf" | "-inf"}``                 a float JSON cannot write
``{"array": entry, "device": "cpu" | "cuda"}``        a NumPy (or CuPy) array
``{"scalar": entry}``                                 a NumPy scalar (``np.float32(1.5)``)
``{"tensor": entry, "device": ..., "requires_grad":   a ``Tensor`` (``parameter``: an
bool, "parameter": bool}``                            ``nn.Parameter``); ``.grad`` is not saved
====================================================  ==========================================

Dtypes are kept exactly: bool, int8 to int64, uint8 to uint64, float16, float32, float64.
Objects that appear twice are written twice and come back as two objects.
"""
from __future__ import annotations

import json
import math
import os
import sys
from collections import OrderedDict
from typing import Any, BinaryIO, Callable, Dict, Optional, Union

import numpy as np

from .backends import device_type, get_backend
from .core.tensor import Tensor

FORMAT_KEY, FORMAT_VERSION = "neural_arch.format", "1"
STRUCTURE_KEY = "neural_arch.structure"
_MAX_HEADER = 100 * 2 ** 20  # safetensors' own limit on the JSON header
_FLOAT_SIZES = (2, 4, 8)
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]


# ----- save ------------------------------------------------------------------------------
def save(obj: Any, f: PathOrFile) -> None:
    """Write ``obj`` (nested dicts, lists and tuples of arrays, tensors, ints, floats, bools,
    None and strings) to ``f``, a path or a binary file object.

    Anything else raises ``TypeError`` naming where it sits, as ``obj['opt']['state'][3]``. A
    path is written to a temporary file next to it and renamed, so a crash while saving leaves
    the previous file whole (a training snapshot is never half written).
    """
    from safetensors.numpy import save as to_bytes

    arrays: Dict[str, np.ndarray] = {}
    structure = _encode(obj, "obj", arrays, set())
    metadata = {FORMAT_KEY: FORMAT_VERSION,
                STRUCTURE_KEY: json.dumps(structure, allow_nan=False, separators=(",", ":"))}
    data = to_bytes(arrays, metadata=metadata)
    if hasattr(f, "write"):
        f.write(data)
        return
    path = os.fspath(f)
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"save: cannot write {path!r}: the folder {folder!r} does not "
                                f"exist")
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        with open(temporary, "wb") as out:  # a plain open: the file mode follows the umask
            out.write(data)
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)


def _parameter_type() -> Optional[type]:
    # No Parameter can exist before ``neural_arch.nn.parameter`` is imported; importing it
    # here just to check would load all of ``nn`` for every save.
    module = sys.modules.get("neural_arch.nn.parameter")
    return None if module is None else module.Parameter


def _host_array(array: Any, where: str) -> np.ndarray:
    if hasattr(array, "__cuda_array_interface__"):
        array = array.get()
    dtype = array.dtype
    if dtype.kind not in "biuf" or (dtype.kind == "f" and dtype.itemsize not in _FLOAT_SIZES):
        raise TypeError(f"save: {where} is an array of dtype {dtype}; save writes bool, int8 to "
                        f"int64, uint8 to uint64, float16, float32 and float64 arrays")
    if not dtype.isnative:
        array = array.astype(dtype.newbyteorder("="))
    return array if array.flags.c_contiguous else array.copy(order="C")  # keeps 0-d arrays


def _add_array(array: Any, where: str, arrays: Dict[str, np.ndarray]) -> str:
    entry = str(len(arrays))
    arrays[entry] = _host_array(array, where)
    return entry


def _encode(obj: Any, where: str, arrays: Dict[str, np.ndarray], open_ids: set) -> Any:
    kind = type(obj)
    if obj is None or kind in (bool, int, str):
        return obj
    if kind is float:
        if math.isfinite(obj):
            return obj
        return {"float": "nan" if math.isnan(obj) else ("inf" if obj > 0 else "-inf")}
    if isinstance(obj, Tensor):
        parameter = _parameter_type()
        return {"tensor": _add_array(obj.data, where, arrays), "device": obj.device,
                "requires_grad": bool(obj.requires_grad),
                "parameter": parameter is not None and isinstance(obj, parameter)}
    if isinstance(obj, np.ndarray) or hasattr(obj, "__cuda_array_interface__"):
        device = "cpu" if isinstance(obj, np.ndarray) else "cuda"
        return {"array": _add_array(obj, where, arrays), "device": device}
    if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
        return {"scalar": _add_array(np.asarray(obj), where, arrays)}
    if kind not in (list, tuple, dict, OrderedDict):
        raise TypeError(f"save: {where} is a {kind.__module__}.{kind.__qualname__}; save writes "
                        f"dicts, lists and tuples of arrays, tensors, ints, floats, bools, None "
                        f"and strings (no pickle, so no other objects)")
    if id(obj) in open_ids:
        raise ValueError(f"save: {where} contains itself; a reference cycle cannot be saved")
    open_ids.add(id(obj))
    try:
        if kind is list:
            return [_encode(v, f"{where}[{i}]", arrays, open_ids) for i, v in enumerate(obj)]
        if kind is tuple:
            return {"tuple": [_encode(v, f"{where}[{i}]", arrays, open_ids)
                              for i, v in enumerate(obj)]}
        items = []
        for key, value in obj.items():
            if type(key) not in (str, int, bool):
                raise TypeError(f"save: {where} has a key {key!r} of type "
                                f"{type(key).__name__}; dict keys must be str, int or bool")
            items.append([key, _encode(value, f"{where}[{key!r}]", arrays, open_ids)])
        return {"dict": items, "ordered": kind is OrderedDict}
    finally:
        open_ids.discard(id(obj))


# ----- load ------------------------------------------------------------------------------
def load(f: PathOrFile, map_location: Any = None, weights_only: Optional[bool] = None) -> Any:
    """Read an object written by ``save`` from a path or a binary file object.

    ``map_location``: None puts every tensor and array back on the device it was saved from;
    "cpu", "cuda" or "cuda:N" (or an int N, meaning "cuda:N", as in torch) puts all of them
    there; a dict such as ``{"cuda:0": "cpu"}`` maps saved devices to new ones. ``weights_only``
    is accepted for torch's signature and changes nothing: nothing here is ever unpickled.

    A file that ``save`` did not write, or a damaged one, raises ``ValueError`` saying which.
    """
    del weights_only
    relocate = _relocation(map_location)
    name = repr(getattr(f, "name", f)) if hasattr(f, "read") else repr(os.fspath(f))
    if hasattr(f, "read"):
        data = f.read()
        metadata = _metadata(data[:8], lambda n: data[8:8 + n], len(data), name)
        read_arrays = _arrays_from_bytes(data, name)
    else:
        path = os.fspath(f)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"load: no file at {path!r}")
        with open(path, "rb") as stream:
            metadata = _metadata(stream.read(8), stream.read, os.path.getsize(path), name)
        read_arrays = _arrays_from_path(path, name)
    try:
        structure = json.loads(metadata[STRUCTURE_KEY])
    except (KeyError, ValueError) as exc:
        raise ValueError(f"load: {name} is damaged: its structure is not readable JSON "
                         f"({exc})") from None
    return _decode(structure, "obj", read_arrays(), relocate, name)


def _not_ours(name: str, reason: str) -> ValueError:
    return ValueError(f"load: {name} is not a file written by neural_arch.save ({reason}); "
                      f"load never unpickles. A plain safetensors file of arrays is read by "
                      f"neural_arch.nn.load_state_dict_file")


def _metadata(first: bytes, read: Callable[[int], bytes], size: int, name: str) -> dict:
    """The safetensors header's metadata, after checking that the file is one of ours."""
    if len(first) < 8:
        raise _not_ours(name, f"it has {size} bytes, fewer than a safetensors header needs")
    length = int.from_bytes(first, "little")
    if length > min(_MAX_HEADER, size - 8):  # not safetensors; say what it looks like
        if first.startswith(b"PK\x03\x04"):
            raise _not_ours(name, "it is a zip archive, as torch.save writes")
        if first[:1] == b"\x80" and first[1:2] in b"\x02\x03\x04\x05":
            raise _not_ours(name, "it starts like a pickle")
        raise _not_ours(name, f"its first 8 bytes announce a {length}-byte header in a "
                              f"{size}-byte file")
    try:
        header = json.loads(read(length))
        metadata = header.get("__metadata__") or {}
    except (ValueError, UnicodeDecodeError, AttributeError) as exc:
        raise _not_ours(name, f"its header is not safetensors JSON: {exc}") from None
    if metadata.get(FORMAT_KEY) != FORMAT_VERSION:
        raise _not_ours(name, f"its metadata has {FORMAT_KEY}={metadata.get(FORMAT_KEY)!r}, "
                              f"expected {FORMAT_VERSION!r}")
    return metadata


def _arrays_from_bytes(data: bytes, name: str) -> Callable[[], Dict[str, np.ndarray]]:
    def read() -> Dict[str, np.ndarray]:
        from safetensors.numpy import load as from_bytes
        try:
            return from_bytes(data)
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise ValueError(f"load: {name} is damaged: {exc}") from None
    return read


def _arrays_from_path(path: str, name: str) -> Callable[[], Dict[str, np.ndarray]]:
    def read() -> Dict[str, np.ndarray]:
        from safetensors import safe_open
        try:
            with safe_open(path, framework="np") as stream:
                return {key: stream.get_tensor(key) for key in stream.keys()}
        except Exception as exc:  # safetensors raises its own SafetensorError
            raise ValueError(f"load: {name} is damaged: {exc}") from None
    return read


def _relocation(map_location: Any) -> Callable[[str], str]:
    """saved device ("cpu" / "cuda") -> device to load onto, checked before reading."""
    if map_location is None:
        return lambda saved: saved
    if isinstance(map_location, dict):
        table = {device_type(k): device_type(v) for k, v in map_location.items()}
        if "cuda" in table.values():
            _require_cuda(map_location)
        return lambda saved: table.get(saved, saved)
    if isinstance(map_location, (str, int)) and not isinstance(map_location, bool):
        target = device_type(map_location)
        if target == "cuda":
            _require_cuda(map_location)
        return lambda saved: target
    raise TypeError(f"load: map_location must be None, a device ('cpu', 'cuda', 'cuda:N'), a "
                    f"device index or a dict of devices, got {type(map_location).__name__} "
                    f"{map_location!r}")


def _require_cuda(map_location: Any) -> None:
    try:
        get_backend("cupy").require()
    except RuntimeError as exc:
        raise RuntimeError(f"load(map_location={map_location!r}): {exc}; load onto the CPU "
                           f"with map_location='cpu'") from None


def _placed(array: np.ndarray, device: str) -> Any:
    if device == "cpu":
        return array
    return get_backend("cupy").asarray(array)  # raises RuntimeError naming why without a GPU


def _decode(node: Any, where: str, arrays: Dict[str, np.ndarray],
            relocate: Callable[[str], str], name: str) -> Any:
    if node is None or isinstance(node, (bool, int, float, str)):
        return node
    if isinstance(node, list):
        return [_decode(v, f"{where}[{i}]", arrays, relocate, name) for i, v in enumerate(node)]
    if not isinstance(node, dict):
        raise ValueError(f"load: {name} is damaged: {where} is {node!r} in its structure")
    if "tuple" in node:
        return tuple(_decode(v, f"{where}[{i}]", arrays, relocate, name)
                     for i, v in enumerate(node["tuple"]))
    if "dict" in node:
        out: Dict[Any, Any] = OrderedDict() if node.get("ordered") else {}
        for item in node["dict"]:
            if not (isinstance(item, list) and len(item) == 2
                    and isinstance(item[0], (str, int, bool))):
                raise ValueError(f"load: {name} is damaged: {where} has the item {item!r}, "
                                 f"not a [key, value] pair")
            out[item[0]] = _decode(item[1], f"{where}[{item[0]!r}]", arrays, relocate, name)
        return out
    if "float" in node and node["float"] in _NONFINITE:
        return _NONFINITE[node["float"]]
    entry = next((node[tag] for tag in ("array", "tensor", "scalar") if tag in node), None)
    if entry not in arrays:
        raise ValueError(f"load: {name} is damaged: {where} is {node!r}, which names no array "
                         f"of the file")
    array = arrays[entry]
    if "scalar" in node:
        return array[()]
    placed = _placed(array, relocate(node.get("device", "cpu")))
    if "array" in node:
        return placed
    requires_grad = bool(node.get("requires_grad", False))
    if node.get("parameter"):
        from .nn.parameter import Parameter
        return Parameter(placed, requires_grad=requires_grad)
    return Tensor(placed, requires_grad=requires_grad, dtype=placed.dtype)


__all__ = ["save", "load"]
