"""``save`` and ``load``: ``torch.save`` / ``torch.load`` for nested containers, without pickle.

A pickle runs code when it is loaded, so a checkpoint downloaded from elsewhere could take over
the machine; these files hold only data. The file is one safetensors file: every array and
tensor of the object is one entry (named "0", "1", ... in the order they are met), and the
object's shape, everything that is not an array, is JSON in the safetensors metadata under
``neural_arch.structure`` (``neural_arch.format`` is the version, "1"; ``neural_arch.sha256``
the file's digest, see ``fileformat``). Any safetensors reader can list the arrays.

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

Dtypes are kept exactly: bool, int8 to int64, uint8 to uint64, float16, float32, float64, and
bfloat16 (``ml_dtypes``' dtype), written as its raw 16 bits under safetensors' own dtype name
``BF16``, so torch's safetensors reads it as ``torch.bfloat16``; loading one without
``ml_dtypes`` raises RuntimeError naming the extra ``neural-arch[bfloat16]``.
Objects that appear twice are written twice and come back as two objects. Containers nest at
most 100 deep.

``load`` trusts nothing in a file (``reading``, ``structure``): a damaged or hostile file is a
``ValueError`` naming it and what is wrong, in time and memory bounded by the file's size (a
stream's: by the sizes its header declares).
``save`` writes a path through a temporary file and removes those that killed saves of the same
name left (``temporaries``).
"""
from __future__ import annotations

import os
from typing import Any, BinaryIO, Callable, Optional, Union

import numpy as np

from ..backends import device_type, get_backend
from .fileformat import damaged, file_pieces
from .reading import binary_reader, open_regular, read_file, stream_size
from .structure import Decoder, encode, parse_json
from .temporaries import write_atomically

PathOrFile = Union[str, "os.PathLike[str]", BinaryIO]


def save(obj: Any, f: PathOrFile) -> None:
    """Write ``obj`` (nested dicts, lists and tuples of arrays, tensors, ints, floats, bools,
    None and strings) to ``f``, a path or a binary file object.

    Anything else raises ``TypeError`` naming where it sits, as ``obj['opt']['state'][3]``. A
    path is written to a temporary file next to it and renamed, so a crash while saving leaves
    the previous file whole (a training snapshot is never half written); the temporary files
    that saves of the same path killed mid-write left are removed first.
    """
    arrays: dict = {}
    pieces = file_pieces(arrays, encode(obj, "obj", arrays, set()))
    if hasattr(f, "write"):
        for piece in pieces:
            f.write(piece)
        return
    write_atomically(os.fspath(f), pieces)


def load(f: PathOrFile, map_location: Any = None, weights_only: Optional[bool] = None) -> Any:
    """Read an object written by ``save`` from a path or a binary file object.

    ``map_location``: None puts every tensor and array back on the device it was saved from;
    "cpu", "cuda" or "cuda:N" (or an int N, meaning "cuda:N", as in torch) puts all of them
    there; a dict such as ``{"cuda:0": "cpu"}`` maps saved devices to new ones. ``weights_only``
    is accepted for torch's signature and changes nothing: nothing here is ever unpickled.

    A file that ``save`` did not write, a damaged one, or a path that is no regular file (a
    device, a FIFO, a directory) raises ``ValueError`` saying which; a file object is read only
    as far as its header declares.
    """
    del weights_only
    relocate = _relocation(map_location)
    if hasattr(f, "read"):
        name = repr(getattr(f, "name", f))
        text, arrays = read_file(binary_reader(f, name), name, stream_size(f), exact=False)
    else:
        path = os.fspath(f)
        name = repr(path)
        with open_regular(path, name) as stream:
            size = os.fstat(stream.fileno()).st_size
            text, arrays = read_file(binary_reader(stream, name), name, size, exact=True)
    try:
        structure = parse_json(text)
    except ValueError as exc:
        raise damaged(name, f"its structure is not readable JSON ({exc})") from None
    return Decoder(arrays, lambda array, saved: _placed(array, relocate(saved)),
                   name).decode(structure)


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


__all__ = ["save", "load"]
