"""Checks made before any worker starts: that what the workers run can reach them.

The workers are fresh interpreters (as multiprocessing's "spawn" starts them), so what they
run is pickled here and unpickled there. A lambda, a function or class defined inside a
function, or anything defined in a notebook cell or ``python -c`` (a ``__main__`` that a new
process cannot import) would fail only there, once per worker; pickling here first names the
part and the object before any process starts. A script's training call must sit under
``if __name__ == "__main__":``: each worker imports the main script to find what it defined,
and unguarded, that import would start the training again in every worker.
"""
from __future__ import annotations

import io
import pickle
import sys
import types
from typing import Any, List, Mapping, Optional, Tuple

ADVICE = ("define models, loss functions and other callables at the top level of a module the "
          "workers can import (a .py file), not as a lambda, inside a function, or in a "
          "notebook cell")


class _RecordingPickler(pickle.Pickler):
    """A pickler that notes the classes and functions it takes from ``__main__``."""

    def __init__(self, buffer: io.BytesIO) -> None:
        super().__init__(buffer, protocol=pickle.HIGHEST_PROTOCOL)
        self.from_main: List[str] = []

    def reducer_override(self, obj: Any) -> Any:
        if isinstance(obj, (type, types.FunctionType)) \
                and getattr(obj, "__module__", None) == "__main__":
            self.from_main.append(obj.__qualname__)
        return NotImplemented  # pickled as usual


def pickle_recipe(recipe: Any, parts: Mapping[str, Any], owner: str) -> bytes:
    """``recipe`` pickled for the workers; TypeError naming the part (one of ``parts``, the
    pieces the caller handed in, by argument name) and the object that cannot travel."""
    buffer = io.BytesIO()
    pickler = _RecordingPickler(buffer)
    try:
        pickler.dump(recipe)
    except Exception as exc:  # pickling raises PicklingError, TypeError, AttributeError, ...
        name, error = _first_unpicklable(parts) or ("the recipe", exc)
        raise TypeError(f"{owner}: {name} cannot be pickled for the worker processes, which "
                        f"start as fresh interpreters (spawn): {type(error).__name__}: {error}; "
                        f"{ADVICE}") from None
    if pickler.from_main and not main_is_importable():
        names = ", ".join(sorted(set(pickler.from_main)))
        raise TypeError(f"{owner}: {names} defined in the __main__ of an interactive session (a "
                        f"notebook, a REPL or python -c), which the worker processes cannot "
                        f"import; {ADVICE}")
    return buffer.getvalue()


def _first_unpicklable(parts: Mapping[str, Any]) -> Optional[Tuple[str, Exception]]:
    for name, part in parts.items():
        try:
            pickle.dumps(part, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:
            return f"{name} ({_describe(part)})", exc
    return None


def _describe(obj: Any) -> str:
    """A function or class by its qualified name (``f.<locals>.g``), anything else by type."""
    if isinstance(obj, (type, types.FunctionType)):
        return obj.__qualname__
    return f"a {type(obj).__qualname__}"


def main_is_importable() -> bool:
    """Whether a worker can import this process's ``__main__`` (a script or ``-m`` module)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    return bool(getattr(main, "__file__", None) or getattr(spec, "name", None))
